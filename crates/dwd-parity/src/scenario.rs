//! What a scenario is: a world to build, a config to run, timed actions, how long to record,
//! and the timeline our binary is expected to produce (checked in CI).
//!
//! Scenarios are plain Rust data (see [`crate::catalogue`]): a file format would need a parser
//! and a schema for little gain, while Rust gives the simulator's own types (node specs, shoot
//! states, endpoint states) and a compiler that checks every scenario.

use std::time::Duration;

use dwd_sim::{EndpointsState, NodeSpec, ShootState};

/// Which subcommand the binary runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `dependency-watchdog prober` with Gardener's prober config (intervals shortened).
    Prober,
    /// `dependency-watchdog weeder` with Gardener's weeder config (`watchDuration` shortened).
    Weeder,
}

/// The KCM, MCM and CA Deployments' names, as Gardener's config targets them.
pub const KCM: &str = "kube-controller-manager";
/// Machine-controller-manager.
pub const MCM: &str = "machine-controller-manager";
/// Cluster-autoscaler.
pub const CA: &str = "cluster-autoscaler";

/// A pod the weeder may delete.
#[derive(Debug, Clone)]
pub struct PodSpec {
    /// Pod name.
    pub name: &'static str,
    /// Its labels.
    pub labels: Vec<(&'static str, &'static str)>,
    /// How its containers look.
    pub state: PodState,
}

/// The containers of a [`PodSpec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodState {
    /// Its container runs and is ready.
    Running,
    /// Its container waits in `CrashLoopBackOff`.
    CrashLooping,
    /// Its init container waits in `CrashLoopBackOff` (the regular one never started).
    InitCrashLooping,
}

/// The world one scenario starts from (built fresh for every run).
#[derive(Debug, Clone)]
pub struct WorldSpec {
    /// The shoot's nodes (prober scenarios); their kubelets renew every second.
    pub nodes: Vec<NodeSpec>,
    /// The Shoot in the Cluster; `None`: reconciled, awake, pool `worker-a`.
    pub shoot_state: Option<ShootState>,
    /// The Deployments `(name, replicas)`.
    pub deployments: Vec<(&'static str, i32)>,
    /// Annotations `(deployment, key, value)` set before the binary starts.
    pub annotations: Vec<(&'static str, &'static str, &'static str)>,
    /// How long a Deployment's status lags its spec (pods "starting").
    pub status_delay: Duration,
    /// EndpointSlices `(service, endpoints, state)` (weeder scenarios).
    pub slices: Vec<(&'static str, usize, EndpointsState)>,
    /// Pods (weeder scenarios).
    pub pods: Vec<PodSpec>,
}

impl WorldSpec {
    /// A healthy shoot with `n` nodes in pool `worker-a`, KCM 2 / MCM 1 / CA 1, status
    /// following spec at once.
    pub fn shoot(n: usize) -> WorldSpec {
        WorldSpec {
            nodes: dwd_sim::node_specs(n, &[dwd_sim::shoot::DEFAULT_POOL]),
            shoot_state: None,
            deployments: vec![(KCM, 2), (MCM, 1), (CA, 1)],
            annotations: Vec::new(),
            status_delay: Duration::ZERO,
            slices: Vec::new(),
            pods: Vec::new(),
        }
    }

    /// A seed namespace with no shoot data plane (weeder scenarios).
    pub fn seed_only() -> WorldSpec {
        WorldSpec {
            nodes: Vec::new(),
            deployments: Vec::new(),
            ..WorldSpec::shoot(0)
        }
    }
}

/// Where a front-door fault applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The seed kube-apiserver (the watchdog's own client).
    Seed,
    /// The shoot kube-apiserver (the probe's client).
    Shoot,
}

/// Something the scenario does to the world while the binary runs.
#[derive(Debug, Clone)]
pub enum Action {
    /// Stops the kubelets of the first `n` nodes (their leases stop being renewed).
    Silence(usize),
    /// Every kubelet renews again.
    ResumeAll,
    /// Sets (`Some`) or removes (`None`) an annotation of a Deployment.
    Annotate(&'static str, &'static str, Option<&'static str>),
    /// Sets a Deployment's `spec.replicas` (as gardenlet or an operator would).
    Scale(&'static str, i32),
    /// Replaces the Shoot in the Cluster (a Cluster edit).
    EditCluster(ShootState),
    /// Writes an EndpointSlice `(service, endpoints, state)`.
    Slice(&'static str, usize, EndpointsState),
    /// Answers every request at this side's front door with `429` and this `Retry-After`
    /// (whole seconds, `None`: no header), or passes them again (`Throttle(side, false, _)`).
    Throttle(Side, bool, Option<u32>),
    /// The first `PATCH`/`PUT` to each object through the seed's front door is answered `409
    /// Conflict` (after a concurrent write), from now on, on new connections; open
    /// connections are closed so the binary's next requests take the new path.
    ConflictOnFirstWrite(bool),
    /// Sends SIGTERM to the binary (the runner records its exit).
    Terminate,
}

/// An action at a time after the binary's start.
#[derive(Debug, Clone)]
pub struct Timed {
    /// Seconds after the binary was started.
    pub at: f64,
    /// What happens.
    pub action: Action,
}

/// Shorthand for a [`Timed`].
pub fn at(at: f64, action: Action) -> Timed {
    Timed { at, action }
}

/// One expectation on our binary's timeline (times in seconds after its start).
#[derive(Debug, Clone)]
pub enum Expect {
    /// The target's `spec.replicas` first takes this value at a time within `[from, to]`.
    Reaches(&'static str, i32, f64, f64),
    /// The target's `spec.replicas` never takes this value.
    Never(&'static str, i32),
    /// The target's `spec.replicas` at the end.
    ReplicasAtEnd(&'static str, i32),
    /// An annotation's value at the end (`None`: absent).
    AnnotationAtEnd(&'static str, &'static str, Option<&'static str>),
    /// The time from the first "`.0` reaches `.1`" to the first "`.2` reaches `.3`" lies
    /// within `[.4, .5]` seconds.
    Gap(&'static str, i32, &'static str, i32, f64, f64),
    /// The pod is deleted at a time within `[from, to]`.
    PodDeleted(&'static str, f64, f64),
    /// The pod is never deleted.
    PodKept(&'static str),
    /// The binary exits with this code (after the scenario's SIGTERM or on its own).
    ExitCode(i32),
    /// Between `min` and `max` warning/error lines contain this text.
    Warnings(&'static str, usize, usize),
    /// The leader-election Lease has no holder within `secs` of the SIGTERM.
    LeaseReleasedWithin(f64),
}

/// Shorthand for the annotation keys.
pub const REPLICAS: &str = dwd_core::scaling::REPLICAS_ANNOTATION;
/// The meltdown-protection marker.
pub const MELTDOWN: &str = dwd_core::scaling::MELTDOWN_ANNOTATION;

/// One scripted scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Short name (`[a-z0-9-]`), used on the command line and in namespaces.
    pub name: &'static str,
    /// The row of issue 13 / README it covers, and what it shows.
    pub about: &'static str,
    /// Prober or weeder.
    pub role: Role,
    /// The world it starts from.
    pub world: WorldSpec,
    /// Edits of the (shortened) Gardener config text, applied in order.
    pub config_edits: Vec<ConfigEdit>,
    /// Run with `--enable-leader-election=true` (the Lease is recorded).
    pub leader_election: bool,
    /// The timed actions.
    pub actions: Vec<Timed>,
    /// How long the binary runs (seconds); then SIGTERM, unless an action sent it earlier.
    pub duration: f64,
    /// Our binary's expected timeline.
    pub expect: Vec<Expect>,
}

/// A change to the config text.
#[derive(Debug, Clone)]
pub enum ConfigEdit {
    /// Replace the first occurrence of `.0` by `.1` (the text must contain `.0`).
    Replace(&'static str, &'static str),
    /// Append this text (top-level keys).
    Append(&'static str),
}

impl ConfigEdit {
    /// Applies the edit; an error when the text to replace is missing (the fixture changed).
    pub fn apply(&self, text: &str) -> anyhow::Result<String> {
        match self {
            ConfigEdit::Replace(from, to) => {
                anyhow::ensure!(
                    text.contains(from),
                    "config edit: {from:?} not found in\n{text}"
                );
                Ok(text.replacen(from, to, 1))
            }
            ConfigEdit::Append(more) => Ok(format!("{text}{more}")),
        }
    }
}
