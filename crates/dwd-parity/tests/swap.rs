//! The swap (issue 23), on real kube-apiservers: an operator switches a live seed from the
//! reference (Gardener's v1.7.0) to ours by changing the Deployment's image, mid-outage, and
//! rolls back the same way. Both binaries run as gardenlet deploys them: Gardener's command line
//! (`deploy/gardener/<role>.yaml`) and config (intervals shortened as every parity run does), as
//! the same identity (a token of Gardener's ServiceAccount under Gardener's RBAC), leader
//! election on the same Lease. Each hand-over is a rolling update's: the new pod starts and waits
//! as a follower, the old pod gets SIGTERM (SIGKILL after Gardener's 5 s grace period), the new
//! one acquires the Lease ([`hand_over`]).
//!
//! `prober_swaps_to_ours_and_back_mid_outage`: one seed, three shoots, each in a state that
//! matters when the hand-over lands, the same seed swapped reference → ours, then ours →
//! reference:
//! - (a) **mid scale-down**: the shoot's kubelets silenced; the old binary has scaled level 0
//!   (MCM and CA) to 0 under the marker and waits for their pods to go (their status lags 6 s;
//!   both binaries wait at most 5 s) before KCM (level 1);
//! - (b) **mid restore**: kubelets back after a whole outage; the old binary has restored KCM
//!   (level 0) and waits out MCM's scale-up `initialDelay` (Gardener's 30 s, 5 s here);
//! - (c) **healthy, with leftover `replicas` records** on running targets (what the reference
//!   leaves on every target it restored; KCM's says 3 while it runs 2, as after gardenlet
//!   scaled it since).
//!
//! After both swaps, the invariants, from a watch of every target version and from the seed's
//! audit log (request bodies of Deployment writes): every target ends at its recorded replicas;
//! no record lost or lowered; no target ever at 0 without the marker; nothing scaled twice
//! (per target the counts written alternate between 0 and the record; each outage one
//! scale-down and one restore per target); on (c) no write to any target, no Event naming it,
//! no `dwd_prober_scaling_attempts_total` series for it (while the new binary demonstrably
//! looked at it).
//!
//! `weeder_swaps_to_ours_and_back_with_a_window_open`: etcd's service turned ready, the old
//! weeder's window is open (it deleted a crash-looping kube-apiserver); the swap lands, another
//! dependant starts crash-looping between the old pod's exit and the new one's takeover: the
//! new weeder deletes it. Every crash-looping dependant is deleted exactly once, nothing else
//! (a healthy dependant, a crash-looping non-dependant) ever.
//!
//! The reference comes from `dwd_testenv::reference::binary` (built once per machine), ours is
//! built by cargo (or `DWD_PARITY_OURS`). About 75 s on 2 cores, both tests at once (the prober's
//! staging runs again, up to three times, should its two states miss each other).

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use chrono::{DateTime, Utc};
use dwd_parity::scenario::{CA, KCM, MCM, Role};
use dwd_parity::shadow::{AuditEntry, flush_audit, http_get};
use dwd_parity::swap::{
    Candidate, Handover, TargetState, TargetWatch, TargetWrite, events_naming, gardener_identity,
    hand_over, records_kept, render_state, scaled_twice, seed_options, stop_old, target,
    target_writes, wait_holder, zero_without_marker,
};
use dwd_parity::world::{GARDEN, MCM_UP_DELAY_S, RENEW_INTERVAL, shortened};
use dwd_sim::{
    DeploymentStatusOptions, DeploymentStatusSim, EndpointsState, SeedControlPlane, SimShoot,
    SimShootOptions,
};
use dwd_testenv::{ApiServer, TestEnv};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

/// Nodes per shoot; all are silenced in an outage.
const NODES: usize = 3;
/// MCM's scale-up `initialDelay` in this test: long enough that the hand-over lands while the
/// old binary waits it out (shoot (b)), short enough for CI (the reference sleeps it in every
/// run of a healthy shoot too, so it also delays the reference's notice of an outage).
const MCM_UP_DELAY: &str = "5s";
/// Shoot (a)'s Deployment status lag while its kubelets are silenced (pods taking their time
/// to go): longer than both binaries' 5 s readiness wait, so level 1 starts 5 s after level 0.
const SCALE_DOWN_LAG: Duration = Duration::from_secs(6);
/// How long the new pod may take to hold the Lease after the SIGTERM: the reference keeps
/// the Lease until it expires (15 s) and retries every 2 s.
const TAKEOVER: Duration = Duration::from_secs(40);

async fn env() -> Result<&'static TestEnv> {
    static ENV: tokio::sync::OnceCell<TestEnv> = tokio::sync::OnceCell::const_new();
    Ok(ENV.get_or_try_init(TestEnv::start).await?)
}

fn reference() -> Result<PathBuf> {
    dwd_testenv::reference::binary().map_err(|e| anyhow!("{e}"))
}

fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
    Ok(path)
}

/// Both binaries, by label.
struct Binaries {
    ours: PathBuf,
    reference: PathBuf,
}

impl Binaries {
    fn locate() -> Result<Binaries> {
        let reference = reference()?;
        let ours = dwd_parity::locate_ours()?;
        eprintln!(
            "ours: {}\nreference: {}",
            ours.display(),
            reference.display()
        );
        Ok(Binaries { ours, reference })
    }

    fn of(&self, label: &str) -> &Path {
        if label == "ours" {
            &self.ours
        } else {
            &self.reference
        }
    }
}

/// Which binary made a request at `t`: the old pod of the first hand-over until it was gone,
/// then each hand-over's new pod (a follower never writes, which the user agents confirm).
fn acting_at(t: &str, first: &'static str, handovers: &[Handover]) -> &'static str {
    let Ok(t) = DateTime::parse_from_rfc3339(t).map(|t| t.with_timezone(&Utc)) else {
        return "?";
    };
    handovers
        .iter()
        .rev()
        .find(|h| t > h.exited)
        .map(|h| h.new)
        .unwrap_or(first)
}

// --- the prober -----------------------------------------------------------------------------

/// One simulated shoot with a shoot apiserver of its own (a probe counts every lease of it).
struct Shoot {
    ns: String,
    sim: SimShoot,
    /// Shoot (a) runs its own status simulation, whose lag changes.
    lag: Option<Mutex<Option<DeploymentStatusSim>>>,
    admin: kube::Client,
    _apiserver: ApiServer,
}

impl Shoot {
    async fn create(
        env: &TestEnv,
        admin: &kube::Client,
        name: &str,
        own_status: bool,
    ) -> Result<Shoot> {
        let apiserver = env.start_apiserver(&format!("swap-{name}-shoot")).await?;
        let ns = format!("shoot--swap--{name}");
        let mut options = SimShootOptions::new(&ns).with_nodes(NODES);
        options.renew_interval = RENEW_INTERVAL;
        if own_status {
            options.deployment_status_delay = None;
        }
        let sim = SimShoot::create(
            admin.clone(),
            apiserver.direct_client().await?,
            apiserver.kubeconfig(),
            options,
        )
        .await
        .with_context(|| format!("create shoot {ns}"))?;
        let shoot = Shoot {
            ns,
            sim,
            lag: own_status.then(|| Mutex::new(None)),
            admin: admin.clone(),
            _apiserver: apiserver,
        };
        shoot.set_lag(Duration::ZERO);
        Ok(shoot)
    }

    /// Makes this shoot's Deployment status follow spec `lag` later from now on.
    fn set_lag(&self, lag: Duration) {
        if let Some(slot) = &self.lag {
            let mut slot = slot.lock().unwrap();
            // The old simulation stops first: one writer of status at a time.
            slot.take();
            *slot = Some(DeploymentStatusSim::start(
                self.admin.clone(),
                DeploymentStatusOptions::namespaces(&[&self.ns]).with_delay(lag),
            ));
        }
    }

    fn seed(&self) -> &SeedControlPlane {
        self.sim.seed()
    }
}

/// Gardener's three targets with their counts.
const COUNTS: [(&str, i32); 3] = [(KCM, 2), (MCM, 1), (CA, 1)];

/// `name` in `ns` is at `replicas` (and under the marker or not).
fn is(state: &TargetState, ns: &str, name: &str, replicas: i32, marker: bool) -> bool {
    target(state, ns, name).is_some_and(|o| o.replicas == replicas && o.marker == marker)
}

/// Every target of `ns` back at its count, no marker.
fn restored(state: &TargetState, ns: &str) -> bool {
    COUNTS.iter().all(|(d, r)| is(state, ns, d, *r, false))
}

/// The prober's world: one seed, shoots (a), (b), (c), a watch of every target.
struct ProberWorld {
    admin: kube::Client,
    seed: ApiServer,
    dir: PathBuf,
    config: PathBuf,
    kubeconfig: PathBuf,
    user: String,
    a: Shoot,
    b: Shoot,
    c: Shoot,
    watch: TargetWatch,
    /// Outages per shoot namespace, for [`check_counts`].
    outages: Mutex<std::collections::BTreeMap<String, usize>>,
}

impl ProberWorld {
    async fn start(env: &TestEnv) -> Result<ProberWorld> {
        let dir = env.dir().join("swap-prober");
        let seed = env
            .start_apiserver_with("swap-prober-seed", seed_options(&dir)?)
            .await?;
        let admin = seed.direct_client().await?;
        SeedControlPlane::new(admin.clone(), GARDEN)
            .create_namespace()
            .await?;
        let (kubeconfig, user) = gardener_identity(&seed, &admin, Role::Prober).await?;
        let kubeconfig = write(&dir, "prober.kubeconfig", &kubeconfig)?;
        let shortened_delay = format!("initialDelay: {MCM_UP_DELAY_S}s\n");
        let config = shortened(Role::Prober)?;
        ensure!(
            config.matches(&shortened_delay).count() == 1,
            "the shortened config has not exactly one {shortened_delay:?}:\n{config}"
        );
        let config = config.replace(&shortened_delay, &format!("initialDelay: {MCM_UP_DELAY}\n"));
        let config = write(&dir, "dep-config.yaml", &config)?;
        let watch = TargetWatch::start(admin.clone());
        let (a, b, c) = tokio::try_join!(
            Shoot::create(env, &admin, "mid-scale-down", true),
            Shoot::create(env, &admin, "mid-restore", false),
            Shoot::create(env, &admin, "leftover-records", false),
        )?;
        // What the reference leaves on every target it restored (KCM's count changed since).
        for (d, record) in [(KCM, "3"), (MCM, "1"), (CA, "1")] {
            c.seed()
                .set_deployment_annotation(d, dwd_core::scaling::REPLICAS_ANNOTATION, Some(record))
                .await?;
        }
        let (na, nb, nc) = (a.ns.clone(), b.ns.clone(), c.ns.clone());
        watch
            .wait(Duration::from_secs(30), "the shoots are built", |s| {
                Ok([&na, &nb, &nc].iter().all(|ns| restored(s, ns)))
            })
            .await?;
        Ok(ProberWorld {
            admin,
            seed,
            dir,
            config,
            kubeconfig,
            user,
            a,
            b,
            c,
            watch,
            outages: Mutex::new(Default::default()),
        })
    }

    fn candidate(&self, bins: &Binaries, label: &'static str, pod: &str) -> Result<Candidate> {
        Candidate::start(
            label,
            bins.of(label),
            Role::Prober,
            pod,
            &self.config,
            &self.kubeconfig,
            &self.dir,
        )
    }

    /// Brings (a) to mid scale-down and (b) to mid restore under the old binary, with `new`
    /// up as a follower. The order makes the states meet whatever the old binary's probe
    /// schedule: (b)'s whole outage first; then (a)'s, until its level 0 is down (the reference
    /// notices late: its healthy-shoot runs sleep MCM's delay); only then (b)'s kubelets come
    /// back, and its KCM is restored about 2 s later, well inside (a)'s 5 s readiness wait.
    /// Should the states still miss each other, both shoots are restored and the staging runs
    /// again (at most three times; each outage is counted for [`check_counts`]).
    async fn stage(&self, new: &mut Candidate) -> Result<()> {
        new.wait_up(Duration::from_secs(30)).await?;
        for attempt in 1..=3 {
            match self.try_stage().await? {
                Ok(()) => return Ok(()),
                Err(missed) => {
                    eprintln!("staging attempt {attempt} missed: {missed}; restoring, again");
                    self.a.set_lag(Duration::ZERO);
                    self.a.sim.kubelets().resume_all();
                    self.b.sim.kubelets().resume_all();
                    let (a, b) = (&self.a.ns, &self.b.ns);
                    self.watch
                        .wait(
                            Duration::from_secs(90),
                            "the old binary restores (a) and (b)",
                            |s| Ok(restored(s, a) && restored(s, b)),
                        )
                        .await?;
                }
            }
        }
        anyhow::bail!("(a) mid scale-down and (b) mid restore never met in three attempts")
    }

    /// One staging: `Ok(Err(why))` when the two states missed each other.
    async fn try_stage(&self) -> Result<Result<(), String>> {
        let (a, b) = (&self.a.ns, &self.b.ns);
        self.silence(&self.b);
        self.watch
            .wait(
                Duration::from_secs(60),
                "the old binary scales (b) down",
                |s| Ok(COUNTS.iter().all(|(d, _)| is(s, b, d, 0, true))),
            )
            .await?;
        self.a.set_lag(SCALE_DOWN_LAG);
        self.silence(&self.a);
        let state = self
            .watch
            .wait(
                Duration::from_secs(60),
                "the old binary scales (a)'s level 0 down",
                |s| Ok((is(s, a, MCM, 0, true) && is(s, a, CA, 0, true)) || is(s, a, KCM, 0, true)),
            )
            .await?;
        if is(&state, a, KCM, 0, true) {
            return Ok(Err("(a)'s KCM went down with its level 0".into()));
        }
        self.b.sim.kubelets().resume_all();
        let state = self
            .watch
            .wait(
                Duration::from_secs(30),
                "the old binary restores (b)'s KCM",
                |s| {
                    Ok(is(s, b, KCM, 2, false)
                        || is(s, a, KCM, 0, true)
                        || target(s, b, MCM).is_some_and(|o| o.replicas > 0))
                },
            )
            .await?;
        if is(&state, a, KCM, 0, true) {
            return Ok(Err("(a)'s KCM went down before (b)'s KCM came back".into()));
        }
        if target(&state, b, MCM).is_some_and(|o| o.replicas > 0) {
            return Ok(Err("(b)'s MCM came back with its KCM".into()));
        }
        Ok(Ok(()))
    }

    /// Silences every kubelet of `shoot`: one more outage of it.
    fn silence(&self, shoot: &Shoot) {
        shoot.sim.kubelets().silence_count(NODES);
        *self
            .outages
            .lock()
            .unwrap()
            .entry(shoot.ns.clone())
            .or_default() += 1;
    }

    /// The states the old binary left when it was gone: the hand-over landed where intended.
    fn check_landed(&self, h: &Handover) -> Result<()> {
        let s = self.watch.at(h.exited);
        let (a, b) = (&self.a.ns, &self.b.ns);
        let mid_scale_down =
            is(&s, a, MCM, 0, true) && is(&s, a, CA, 0, true) && is(&s, a, KCM, 2, false);
        let mid_restore =
            is(&s, b, KCM, 2, false) && is(&s, b, MCM, 0, true) && is(&s, b, CA, 0, true);
        ensure!(
            mid_scale_down && mid_restore,
            "{}: when the old pod was gone, (a) mid scale-down {mid_scale_down}, (b) mid restore {mid_restore}:\n{}",
            h.describe(),
            render_state(&s)
        );
        Ok(())
    }

    /// The new binary finishes (a)'s scale-down; (a)'s kubelets come back; both shoots end
    /// restored.
    async fn finish(&self, new: &str) -> Result<()> {
        let (a, b) = (&self.a.ns, &self.b.ns);
        self.watch
            .wait(
                Duration::from_secs(60),
                &format!("{new} scales (a)'s KCM down"),
                |s| Ok(is(s, a, KCM, 0, true)),
            )
            .await?;
        self.a.set_lag(Duration::ZERO);
        self.a.sim.kubelets().resume_all();
        self.watch
            .wait(
                Duration::from_secs(90),
                &format!("{new} restores (a) and (b)"),
                |s| Ok(restored(s, a) && restored(s, b)),
            )
            .await?;
        Ok(())
    }
}

/// One hand-over of the prober from `old` to `new_label`, (a) and (b) staged first; with
/// `scrape`, `old`'s metrics just before it is stopped.
async fn swap_prober(
    world: &ProberWorld,
    bins: &Binaries,
    old: &mut Candidate,
    new_label: &'static str,
    new_pod: &str,
    scrape: bool,
) -> Result<(Candidate, Handover, Option<String>)> {
    let mut new = world.candidate(bins, new_label, new_pod)?;
    world.stage(&mut new).await?;
    let scraped = if scrape {
        Some(metrics(old).await?)
    } else {
        None
    };
    let h = hand_over(&world.admin, Role::Prober, old, &mut new, TAKEOVER).await?;
    eprintln!("{}", h.describe());
    world.check_landed(&h)?;
    world.finish(new_label).await?;
    Ok((new, h, scraped))
}

async fn metrics(c: &Candidate) -> Result<String> {
    let (status, body) = http_get(c.metrics_port, "/metrics").await?;
    ensure!(status == 200, "GET /metrics of {}: {status}", c.label);
    Ok(body)
}

// The hand-over and its rollback happen mid-outage in one world, and the invariants below read
// the audit log of both; the story reads top to bottom in the order it runs.
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prober_swaps_to_ours_and_back_mid_outage() -> Result<()> {
    let started = Instant::now();
    let bins = Binaries::locate()?;
    let env = env().await?;
    let world = ProberWorld::start(env).await?;
    let (a, b, c) = (world.a.ns.clone(), world.b.ns.clone(), world.c.ns.clone());
    eprintln!("world built in {:.1}s", started.elapsed().as_secs_f64());

    // The reference runs the seed.
    let mut reference =
        world.candidate(&bins, "reference", "dependency-watchdog-prober-6b8f4-r1")?;
    wait_holder(&world.admin, Role::Prober, None, Duration::from_secs(30)).await?;

    // 1. Reference → ours.
    let (mut ours, to_ours, _) = swap_prober(
        &world,
        &bins,
        &mut reference,
        "ours",
        "dependency-watchdog-prober-7c9d5-o1",
        false,
    )
    .await?;
    eprintln!(
        "reference → ours done at {:.1}s",
        started.elapsed().as_secs_f64()
    );

    // 2. Ours → reference (rollback); ours' metrics read just before it goes.
    let (mut reference, to_reference, scraped) = swap_prober(
        &world,
        &bins,
        &mut ours,
        "reference",
        "dependency-watchdog-prober-6b8f4-r2",
        true,
    )
    .await?;
    eprintln!(
        "ours → reference done at {:.1}s",
        started.elapsed().as_secs_f64()
    );
    ensure!(
        to_reference.exit_code == Some(0) && !to_reference.killed,
        "ours did not exit 0 within the grace period on SIGTERM: {}; log: {}",
        to_reference.describe(),
        ours.log.display()
    );
    let _ = reference
        .process
        .stop(dwd_parity::swap::TERMINATION_GRACE)
        .await;
    let stopped_at = Utc::now();

    // --- the invariants ---------------------------------------------------------------------
    let seen = world.watch.observations();
    let mut failures: Vec<String> = Vec::new();
    failures.extend(zero_without_marker(&seen));
    failures.extend(records_kept(&seen));
    let end = world.watch.now();
    for ns in [&a, &b] {
        if !restored(&end, ns) {
            failures.push(format!("{ns} does not end at its recorded replicas"));
        }
    }
    for (d, record) in [(KCM, "3"), (MCM, "1"), (CA, "1")] {
        let kept = target(&end, &c, d).is_some_and(|o| {
            o.record.as_deref() == Some(record)
                && !o.marker
                && COUNTS.iter().any(|(n, r)| n == &d && *r == o.replicas)
        });
        if !kept {
            failures.push(format!("{c}/{d} changed: {:?}", target(&end, &c, d)));
        }
    }

    let entries = flush_audit(
        &world.admin,
        &world.seed.audit_log_path(),
        "swap-flush-prober",
    )
    .await?;
    let handovers = [to_ours.clone(), to_reference.clone()];
    let writes = target_writes(&entries, &world.user);
    eprintln!("target writes (by the binary acting at the time):");
    for w in &writes {
        eprintln!(
            "  {:<9} {}",
            acting_at(&w.entry.received, "reference", &handovers),
            w.describe()
        );
    }
    failures.extend(scaled_twice(&writes));
    failures.extend(check_counts(&writes, &world.outages.lock().unwrap()));
    failures.extend(check_agents(&writes, &handovers));
    // (c): nothing written to it by anyone with the watchdog's identity, no Event, no metric.
    let c_writes: Vec<String> = entries
        .iter()
        .filter(|e| e.user == world.user && e.is_write() && e.namespace == c)
        .map(AuditEntry::describe)
        .collect();
    if !c_writes.is_empty() {
        failures.push(format!(
            "writes to the healthy {c}:\n{}",
            c_writes.join("\n")
        ));
    }
    let c_events = events_naming(&world.admin, &c).await?;
    if !c_events.is_empty() {
        failures.push(format!(
            "Events about the healthy {c}:\n{}",
            c_events.join("\n")
        ));
    }
    let a_events = events_naming(&world.admin, &a).await?;
    ensure!(
        !a_events.is_empty(),
        "no Event names {a}: the Event check would not see ours' events"
    );
    let text = scraped.context("ours' metrics were not read")?;
    let attempts = |ns: &str| {
        dwd_testenv::metrics::sum(&text, "dwd_prober_scaling_attempts_total", &[("shoot", ns)])
    };
    let probes_c =
        dwd_testenv::metrics::sum(&text, "dwd_prober_shoot_probe_runs_total", &[("shoot", &c)]);
    ensure!(
        attempts(&a) > 0.0 && probes_c > 0.0,
        "ours' metrics show no scaling of {a} ({}) or no probe of {c} ({probes_c}): the metric check would see nothing",
        attempts(&a)
    );
    if attempts(&c) != 0.0 {
        failures.push(format!(
            "dwd_prober_scaling_attempts_total of the healthy {c}: {}",
            text.lines()
                .filter(|l| l.starts_with("dwd_prober_scaling_attempts_total") && l.contains(&c))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    // The reference read (c)'s targets after it took over (its scale-up flow runs on every
    // healthy probe): it looked, and wrote nothing.
    let reference_reads = entries
        .iter()
        .filter(|e| {
            e.user == world.user
                && e.verb == "get"
                && e.resource == "deployments"
                && e.namespace == c
                && acting_at(&e.received, "reference", &handovers) == "reference"
                && DateTime::parse_from_rfc3339(&e.received)
                    .is_ok_and(|t| t.with_timezone(&Utc) > to_reference.acquired && t < stopped_at)
        })
        .count();
    eprintln!(
        "(c) {c}: ours probed it {probes_c} times, the reference read its targets {reference_reads} times after taking over; 0 writes, 0 Events, no scaling series"
    );
    ensure!(
        failures.is_empty(),
        "{} invariant violation(s):\n{}\nlogs in {}",
        failures.len(),
        failures.join("\n"),
        world.dir.display()
    );
    eprintln!(
        "prober_swaps_to_ours_and_back_mid_outage: {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Per target of each shoot, one scale-down and one restore (to its count) per outage, over
/// the whole run.
fn check_counts(
    writes: &[TargetWrite],
    outages: &std::collections::BTreeMap<String, usize>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (ns, n) in outages {
        for (d, count) in COUNTS {
            let set: Vec<i64> = writes
                .iter()
                .filter(|w| &w.entry.namespace == ns && w.entry.name == d)
                .filter_map(|w| w.replicas)
                .collect();
            let want: Vec<i64> = [0, i64::from(count)].repeat(*n);
            if set != want {
                out.push(format!(
                    "{ns}/{d}: replica counts written {set:?}, want {want:?} ({n} outages)"
                ));
            }
        }
    }
    out
}

/// The user agents of the target writes in each stretch between hand-overs: the binary acting
/// then is the only one writing (the follower never does). A user agent seen in two stretches
/// that different binaries led is a write by a follower.
fn check_agents(writes: &[TargetWrite], handovers: &[Handover]) -> Vec<String> {
    let mut agents: std::collections::BTreeMap<&str, std::collections::BTreeSet<&str>> =
        Default::default();
    for w in writes {
        agents
            .entry(acting_at(&w.entry.received, handovers[0].old, handovers))
            .or_default()
            .insert(w.entry.user_agent.as_str());
    }
    eprintln!("user agents of target writes by acting binary: {agents:?}");
    match (agents.get("ours"), agents.get("reference")) {
        (Some(o), Some(r)) if !o.is_disjoint(r) => vec![format!(
            "the same user agent wrote targets while ours led and while the reference led: {:?}",
            o.intersection(r).collect::<Vec<_>>()
        )],
        _ => Vec::new(),
    }
}

// --- the weeder -----------------------------------------------------------------------------

const CONTROLPLANE: (&str, &str) = ("gardener.cloud/role", "controlplane");

// Both hand-overs happen while one weeder window is open, and the closing check counts each
// victim across both; the story reads top to bottom in the order it runs.
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weeder_swaps_to_ours_and_back_with_a_window_open() -> Result<()> {
    let started = Instant::now();
    let bins = Binaries::locate()?;
    let env = env().await?;
    let dir = env.dir().join("swap-weeder");
    let seed = env
        .start_apiserver_with("swap-weeder-seed", seed_options(&dir)?)
        .await?;
    let admin = seed.direct_client().await?;
    SeedControlPlane::new(admin.clone(), GARDEN)
        .create_namespace()
        .await?;
    let (kubeconfig, user) = gardener_identity(&seed, &admin, Role::Weeder).await?;
    let kubeconfig = write(&dir, "weeder.kubeconfig", &kubeconfig)?;
    // Windows of a minute: the old weeder's is still open at the hand-over.
    let config = shortened(Role::Weeder)?;
    ensure!(config.contains("watchDuration: 15s\n"), "{config}");
    let config = write(
        &dir,
        "dep-config.yaml",
        &config.replace("watchDuration: 15s\n", "watchDuration: 1m0s\n"),
    )?;

    // A control plane whose etcd is not ready yet; etcd itself crash-loops (not a dependant of
    // either service), one kube-apiserver stays healthy, four will crash-loop one by one.
    let ns = "shoot--swap--weeder";
    let plane = SeedControlPlane::new(admin.clone(), ns);
    plane.create_namespace().await?;
    plane
        .set_endpoint_slice("etcd-main-client", 1, EndpointsState::NotReady)
        .await?;
    let apiserver = [CONTROLPLANE, ("role", "apiserver")];
    plane
        .create_crashlooping_pod("etcd-main-0", &[CONTROLPLANE, ("role", "main")])
        .await?;
    plane
        .create_running_pod("kube-apiserver-healthy", &apiserver)
        .await?;
    let victims = [
        "kube-apiserver-a",
        "kube-apiserver-b",
        "kube-apiserver-c",
        "kube-apiserver-d",
    ];
    for v in victims {
        plane.create_running_pod(v, &apiserver).await?;
    }
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let deleted = |pod: &'static str, by: &'static str| {
        let pods = pods.clone();
        async move {
            dwd_testenv::eventually(
                Duration::from_secs(60),
                &format!("{by} deletes the crash-looping {pod}"),
                || {
                    let pods = pods.clone();
                    async move {
                        let p = pods.get_opt(pod).await.map_err(|e| e.to_string())?;
                        Ok(p.is_none().then_some(()))
                    }
                },
            )
            .await
            .map_err(|e| anyhow!(e))
        }
    };
    let candidate = |label: &'static str, pod: &str| {
        Candidate::start(
            label,
            bins.of(label),
            Role::Weeder,
            pod,
            &config,
            &kubeconfig,
            &dir,
        )
    };

    // The reference runs the seed; etcd comes back: its window opens; a dependant crash-loops.
    let mut reference = candidate("reference", "dependency-watchdog-weeder-5d6c7-r1")?;
    wait_holder(&admin, Role::Weeder, None, Duration::from_secs(30)).await?;
    plane
        .set_endpoint_slice("etcd-main-client", 1, EndpointsState::AllReady)
        .await?;
    plane.set_crashlooping(victims[0], true).await?;
    deleted(victims[0], "the reference").await?;

    // 1. Reference → ours, the window open; a dependant starts crash-looping once the old pod
    // is gone, before the new one leads.
    let mut ours = candidate("ours", "dependency-watchdog-weeder-8f9a1-o1")?;
    ours.wait_up(Duration::from_secs(30)).await?;
    let stopped = stop_old(&admin, Role::Weeder, &mut reference, &mut ours).await?;
    plane.set_crashlooping(victims[1], true).await?;
    let to_ours = stopped
        .taken_over(&admin, Role::Weeder, &ours, TAKEOVER)
        .await?;
    eprintln!("{}", to_ours.describe());
    deleted(victims[1], "ours (its window opened at its start)").await?;
    plane.set_crashlooping(victims[2], true).await?;
    deleted(victims[2], "ours").await?;

    // 2. Ours → reference, ours' window open; the same.
    let mut reference = candidate("reference", "dependency-watchdog-weeder-5d6c7-r2")?;
    reference.wait_up(Duration::from_secs(30)).await?;
    let stopped = stop_old(&admin, Role::Weeder, &mut ours, &mut reference).await?;
    plane.set_crashlooping(victims[3], true).await?;
    let to_reference = stopped
        .taken_over(&admin, Role::Weeder, &reference, TAKEOVER)
        .await?;
    eprintln!("{}", to_reference.describe());
    ensure!(
        to_reference.exit_code == Some(0) && !to_reference.killed,
        "ours did not exit 0 within the grace period on SIGTERM: {}",
        to_reference.describe()
    );
    deleted(victims[3], "the reference (its window opened at its start)").await?;
    let _ = reference
        .process
        .stop(dwd_parity::swap::TERMINATION_GRACE)
        .await;

    // Nothing else was deleted; each victim exactly once, by the binary acting then.
    for keep in ["etcd-main-0", "kube-apiserver-healthy"] {
        ensure!(pods.get_opt(keep).await?.is_some(), "{keep} was deleted");
    }
    let entries = flush_audit(&admin, &seed.audit_log_path(), "swap-flush-weeder").await?;
    let handovers = [to_ours, to_reference];
    let deletions: Vec<(&str, String)> = entries
        .iter()
        .filter(|e| e.user == user && e.resource == "pods" && e.is_write())
        .map(|e| {
            (
                acting_at(&e.received, "reference", &handovers),
                e.describe(),
            )
        })
        .collect();
    for (by, d) in &deletions {
        eprintln!("  {by:<9} {d}");
    }
    let want = [
        (victims[0], "reference"),
        (victims[1], "ours"),
        (victims[2], "ours"),
        (victims[3], "reference"),
    ];
    let got: Vec<(String, &str)> = entries
        .iter()
        .filter(|e| e.user == user && e.resource == "pods" && e.is_write())
        .map(|e| {
            (
                e.name.clone(),
                acting_at(&e.received, "reference", &handovers),
            )
        })
        .collect();
    let want: Vec<(String, &str)> = want.iter().map(|(p, b)| (p.to_string(), *b)).collect();
    ensure!(
        got == want,
        "pod writes {got:?}, want each crash-looping dependant deleted once by the binary acting: {want:?}"
    );
    eprintln!(
        "weeder_swaps_to_ours_and_back_with_a_window_open: {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
