//! One run: a scenario's world built on a lane, one binary started on it with Gardener's
//! command line, the scenario's actions applied at their times, the timeline recorded, the
//! binary stopped, the world cleaned up.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dwd_testenv::process::{ManagedProcess, Signal};

use crate::scenario::{Action, Scenario, Side};
use crate::timeline::{Event, Recorder, Timeline, log_warnings};
use crate::world::{Lane, ScenarioWorld, command_line, lease_name, shortened};

/// How long a binary may take to exit after SIGTERM before it is killed.
const EXIT_TIMEOUT: Duration = Duration::from_secs(20);

/// What one run produced.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// Which binary (`ours`, `reference`, or a path).
    pub label: String,
    /// The recorded timeline.
    pub timeline: Timeline,
    /// The binary's log (stdout and stderr).
    pub log: PathBuf,
}

/// The binary as a child process (a [`ManagedProcess`]); killed on drop (and by the kernel if
/// we die first).
pub struct Binary {
    process: ManagedProcess,
}

impl Binary {
    /// Starts `bin` with `args`, stdout and stderr to `log`, without the variables that would
    /// change what it does (`POD_NAME`, `POD_NAMESPACE`, `RUST_LOG`, `KUBECONFIG`).
    pub fn spawn(bin: &Path, args: &[String], log: &Path) -> Result<Binary> {
        Self::spawn_with_env(bin, args, &[], log)
    }

    /// Like [`Binary::spawn`], with these variables set (e.g. the pod a shadow's Events are
    /// about).
    pub fn spawn_with_env(
        bin: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log: &Path,
    ) -> Result<Binary> {
        let process = ManagedProcess::builder(&bin.display().to_string(), bin)
            .args(args)
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .env_remove("RUST_LOG")
            .env_remove("KUBECONFIG")
            .envs(env.iter().copied())
            .log(log)
            .spawn()
            .with_context(|| format!("start {}", bin.display()))?;
        Ok(Binary { process })
    }

    /// `Some(code)` once exited (`Some(None)`: by a signal).
    pub fn exited(&mut self) -> Option<Option<i32>> {
        self.process.exit_status().map(|s| s.code())
    }

    /// SIGTERM, then waits up to `timeout` for the exit (then it is killed on drop): the
    /// exit code, `None` when it did not exit in time or died by a signal.
    pub async fn stop(&mut self, timeout: Duration) -> Option<i32> {
        self.sigterm();
        self.process.wait_exit(timeout).await?.code()
    }

    /// Asks it to stop (SIGTERM), unless it has exited.
    pub fn sigterm(&mut self) {
        let _ = self.process.signal(Signal::TERM);
    }

    /// SIGKILL (what the kubelet sends once a pod's grace period is over), then waits up to
    /// 5 s for it to be reaped.
    pub async fn kill(&mut self) {
        let _ = self.process.signal(Signal::KILL);
        let _ = self.process.wait_exit(Duration::from_secs(5)).await;
    }
}

/// Runs `scenario` with `bin` on `lane`; the world is built before and removed after.
pub async fn run(lane: &Lane, scenario: &Scenario, bin: &Path, label: &str) -> Result<RunResult> {
    let world = lane.build(scenario).await?;
    let result = run_in(lane, scenario, bin, label, &world).await;
    reset_doors(lane)?;
    let cleaned = world.clean_up().await;
    let result = result?;
    cleaned.with_context(|| format!("clean up after {}", scenario.name))?;
    Ok(result)
}

/// Front doors back to passing everything (a scenario may end while faulting).
fn reset_doors(lane: &Lane) -> Result<()> {
    for door in [&lane.seed, &lane.shoot] {
        door.set_throttled(false);
        door.set_retry_after(Some(0));
    }
    lane.seed.set_conflict_on_first_write(false)?;
    Ok(())
}

/// The scenario's role's config, shortened and with the scenario's edits, written to `path`.
fn write_config(scenario: &Scenario, path: &Path) -> Result<PathBuf> {
    let mut config = shortened(scenario.role)?;
    for edit in &scenario.config_edits {
        config = edit.apply(&config)?;
    }
    std::fs::write(path, &config).with_context(|| format!("write {}", path.display()))?;
    Ok(path.to_path_buf())
}

/// Waits up to [`EXIT_TIMEOUT`] for `child` to exit; its exit (seconds since `start`, code),
/// or `None` when it is still running then.
async fn wait_for_exit(child: &mut Binary, start: Instant) -> Option<(f64, Option<i32>)> {
    let deadline = Instant::now() + EXIT_TIMEOUT;
    loop {
        if let Some(code) = child.exited() {
            return Some((start.elapsed().as_secs_f64(), code));
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The run's timeline: what the recorder saw, the binary's exit and the warnings its log at
/// `log` wrote (their times from `start_utc`; a line without one at `elapsed`), in time order.
fn timeline_of(
    mut events: Vec<(f64, Event)>,
    exit: Option<(f64, Option<i32>)>,
    log: &Path,
    start_utc: chrono::DateTime<chrono::Utc>,
    elapsed: f64,
) -> Timeline {
    if let Some((t, code)) = exit {
        events.push((t, Event::Exit(code)));
    }
    let text = std::fs::read_to_string(log).unwrap_or_default();
    events.extend(log_warnings(&text, start_utc, elapsed));
    let mut timeline = Timeline { events };
    timeline.sort();
    timeline
}

async fn run_in(
    lane: &Lane,
    scenario: &Scenario,
    bin: &Path,
    label: &str,
    world: &ScenarioWorld,
) -> Result<RunResult> {
    let stem = format!("{}-{}", world.namespace, sanitize(label));
    let config_path = write_config(scenario, &lane.dir.join(format!("{stem}.yaml")))?;
    let ports = [
        dwd_testenv::free_port()?,
        dwd_testenv::free_port()?,
        dwd_testenv::free_port()?,
    ];
    let args = command_line(
        scenario,
        &config_path,
        &lane.seed_kubeconfig(),
        ports,
        &world.namespace,
    );
    let log = lane.dir.join(format!("{stem}.log"));
    let lease = scenario.leader_election.then(|| {
        (
            world.namespace.clone(),
            lease_name(scenario.role).to_string(),
        )
    });

    let start_utc = chrono::Utc::now();
    let start = Instant::now();
    let mut child = Binary::spawn(bin, &args, &log)?;
    let recorder = Recorder::start(lane.seed_direct.clone(), &world.namespace, lease, start);
    let mut actions = scenario.actions.clone();
    actions.sort_by(|a, b| a.at.total_cmp(&b.at));
    let mut exit: Option<(f64, Option<i32>)> = None;
    let mut terminated = false;
    let mut next = 0;
    let end = Duration::from_secs_f64(scenario.duration);
    // The script's clock: each action at its time; the exit is polled meanwhile.
    loop {
        let now = start.elapsed();
        if exit.is_none()
            && let Some(code) = child.exited()
        {
            exit = Some((now.as_secs_f64(), code));
        }
        if let Some(timed) = actions.get(next)
            && now.as_secs_f64() >= timed.at
        {
            let what = apply(lane, world, &timed.action, &mut child)
                .await
                .with_context(|| format!("{}: action at {}s", scenario.name, timed.at))?;
            if matches!(timed.action, Action::Terminate) {
                terminated = true;
            }
            recorder.note(start.elapsed().as_secs_f64(), Event::Action(what));
            next += 1;
            continue;
        }
        if now >= end {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if !terminated && exit.is_none() {
        child.sigterm();
    }
    if exit.is_none() {
        exit = wait_for_exit(&mut child, start).await;
    }
    let timeline = timeline_of(
        recorder.finish(),
        exit,
        &log,
        start_utc,
        start.elapsed().as_secs_f64(),
    );
    Ok(RunResult {
        label: label.to_string(),
        timeline,
        log,
    })
}

fn sanitize(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

/// Applies one action; its description for the timeline.
async fn apply(
    lane: &Lane,
    world: &ScenarioWorld,
    action: &Action,
    child: &mut Binary,
) -> Result<String> {
    let seed = &world.seed;
    let kubelets = || {
        world
            .sim
            .as_ref()
            .map(|s| s.kubelets())
            .context("no simulated shoot in this scenario")
    };
    Ok(match action {
        Action::Silence(n) => {
            let nodes = kubelets()?.silence_count(*n);
            format!("silence {n} kubelets ({})", nodes.join(", "))
        }
        Action::ResumeAll => {
            kubelets()?.resume_all();
            "resume every kubelet".to_string()
        }
        Action::Annotate(d, k, v) => {
            seed.set_deployment_annotation(d, k, *v).await?;
            let k = k.rsplit('/').next().unwrap_or(k);
            match v {
                Some(v) => format!("annotate {} {k}={v:?}", crate::timeline::short(d)),
                None => format!("remove {} {k}", crate::timeline::short(d)),
            }
        }
        Action::Scale(d, r) => {
            seed.scale_deployment(d, *r).await?;
            format!("scale {} to {r}", crate::timeline::short(d))
        }
        Action::EditCluster(state) => {
            seed.set_shoot_state(state).await?;
            format!("edit the Cluster: {}", describe_state(state))
        }
        Action::Slice(service, n, state) => {
            seed.set_endpoint_slice(service, *n, *state).await?;
            format!("EndpointSlice {service}: {state:?} of {n}")
        }
        Action::Throttle(side, on, retry_after) => {
            let door = match side {
                Side::Seed => &lane.seed,
                Side::Shoot => &lane.shoot,
            };
            door.set_retry_after(*retry_after);
            door.set_throttled(*on);
            // Pooled connections too: a storm reaches every client, not only new ones.
            door.drop_connections();
            if *on {
                format!("{side:?} answers 429, Retry-After {retry_after:?}")
            } else {
                format!("{side:?} serves again")
            }
        }
        Action::ConflictOnFirstWrite(on) => {
            lane.seed.set_conflict_on_first_write(*on)?;
            lane.seed.drop_connections();
            if *on {
                "seed: first write to each object answered 409 Conflict".to_string()
            } else {
                "seed: no more conflicts".to_string()
            }
        }
        Action::Terminate => {
            child.sigterm();
            "SIGTERM to the binary".to_string()
        }
    })
}

fn describe_state(state: &dwd_sim::ShootState) -> String {
    let pools: Vec<String> = state
        .workers
        .iter()
        .map(|w| match &w.node_conditions {
            Some(c) => format!("{} nodeConditions {c:?}", w.name),
            None => w.name.clone(),
        })
        .collect();
    let mut out = format!("pools [{}]", pools.join("; "));
    if let Some(g) = &state.node_monitor_grace_period {
        out.push_str(&format!(", nodeMonitorGracePeriod {g}"));
    }
    out
}
