//! The swap (issue 23): the reference and ours hand a live seed over to each other through the
//! leader Lease, as a rolling update of gardenlet's Deployment does when an operator switches
//! the image (and back when they roll back). What `tests/swap.rs` needs:
//!
//! - [`seed_options`]: a seed whose audit log keeps the bodies of writes to Deployments, so
//!   every scaling write is read back with the replicas it set ([`target_writes`]).
//! - [`gardener_identity`]: the ServiceAccount and RBAC of `deploy/gardener/<role>.yaml`
//!   applied as shipped, and a kubeconfig with that ServiceAccount's token: both binaries run
//!   as the same identity, as two pods of one Deployment do.
//! - [`Candidate`]: one pod of the Deployment, a binary with Gardener's command line
//!   ([`crate::world::command_line`]), its own host name (the pod name) and loopback ports.
//! - [`hand_over`]: the rolling update's last step. The new pod already runs (as a follower;
//!   with Gardener's `maxSurge` it starts before the old one is stopped); the old one gets
//!   SIGTERM, and SIGKILL after Gardener's `terminationGracePeriodSeconds`, as the kubelet
//!   would; the new one acquires the Lease.
//! - [`TargetWatch`]: every version of every Deployment of the seed, from a watch (not
//!   sampled: a state that lasts a millisecond is seen), for the invariants.
//! - The invariants, pure functions over what was seen ([`zero_without_marker`],
//!   [`records_kept`], [`scaled_twice`]), unit-tested below.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use chrono::{DateTime, Utc};
use dwd_core::scaling::{MELTDOWN_ANNOTATION, REPLICAS_ANNOTATION};
use dwd_sim::AbortOnDrop;
use dwd_testenv::{ApiServer, ApiServerOptions};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Event as CoreEvent;
use k8s_openapi::api::events::v1::Event as NewEvent;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;

use crate::runner::Binary;
use crate::scenario::{Role, Scenario, WorldSpec};
use crate::shadow::{AuditEntry, apply_documents, gardener_documents};
use crate::world::{GARDEN, command_line, lease_name};

/// Gardener's `terminationGracePeriodSeconds` of both Deployments: the kubelet sends SIGKILL
/// this long after SIGTERM.
pub const TERMINATION_GRACE: Duration = Duration::from_secs(5);

/// The audit policy: the request bodies of writes to Deployments and their `scale`
/// subresource (what a scaling write set), metadata for everything else.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Request
  verbs: [create, update, patch]
  resources:
  - group: apps
    resources: [deployments, deployments/scale]
- level: Metadata
";

/// A seed (CRDs installed) with an audit log that keeps the bodies of Deployment writes; the
/// policy file is written to `dir`.
pub fn seed_options(dir: &Path) -> Result<ApiServerOptions> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let policy = dir.join("swap-audit-policy.yaml");
    std::fs::write(&policy, AUDIT_POLICY).with_context(|| format!("write {}", policy.display()))?;
    Ok(ApiServerOptions {
        audit_log: true,
        // Appended after the test environment's own policy flag, so this one wins.
        extra_args: vec![format!("--audit-policy-file={}", policy.display())],
        ..ApiServerOptions::seed()
    })
}

/// The kinds of `deploy/gardener/<role>.yaml` that make the watchdog's identity.
const IDENTITY_KINDS: [&str; 5] = [
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
];

/// Gardener's identity for `role`: the ServiceAccount, ClusterRole, Role and their bindings of
/// `deploy/gardener/<role>.yaml` applied to the seed as shipped; the kubeconfig (through the
/// seed's front door, with a token of that ServiceAccount) and the user name the audit log
/// shows.
pub async fn gardener_identity(
    seed: &ApiServer,
    admin: &kube::Client,
    role: Role,
) -> Result<(String, String)> {
    let docs: Vec<Value> = gardener_documents(role)?
        .into_iter()
        .filter(|d| IDENTITY_KINDS.iter().any(|k| d["kind"] == *k))
        .collect();
    ensure!(
        docs.len() == IDENTITY_KINDS.len(),
        "deploy/gardener has {} identity objects for {role:?}, want one of each of {IDENTITY_KINDS:?}",
        docs.len()
    );
    apply_documents(&docs, admin, "deploy/gardener").await?;
    let sa = docs
        .iter()
        .find(|d| d["kind"] == "ServiceAccount")
        .and_then(|d| d["metadata"]["name"].as_str())
        .context("the ServiceAccount has no name")?
        .to_string();
    let kubeconfig = dwd_testenv::service_account::kubeconfig(seed, admin, GARDEN, &sa).await?;
    Ok((kubeconfig, format!("system:serviceaccount:{GARDEN}:{sa}")))
}

/// One pod of the watchdog's Deployment.
pub struct Candidate {
    /// `ours` or `reference`.
    pub label: &'static str,
    /// Its pod (host) name.
    pub pod: String,
    /// The process.
    pub process: Binary,
    /// Its log (stdout and stderr).
    pub log: PathBuf,
    /// Its `--metrics-bind-addr` port.
    pub metrics_port: u16,
}

impl Candidate {
    /// Starts `bin` as pod `pod`: Gardener's command line for `role` with leader election in
    /// `garden`, `config` and `kubeconfig` given on the command line, loopback ports of its
    /// own, `HOSTNAME` set to the pod name (a pod's host name); the log goes to `dir`.
    pub fn start(
        label: &'static str,
        bin: &Path,
        role: Role,
        pod: &str,
        config: &Path,
        kubeconfig: &Path,
        dir: &Path,
    ) -> Result<Candidate> {
        let ports = [
            dwd_testenv::free_port()?,
            dwd_testenv::free_port()?,
            dwd_testenv::free_port()?,
        ];
        let args = command_line(&gardener_scenario(role), config, kubeconfig, ports, GARDEN);
        let log = dir.join(format!("{pod}.log"));
        let process = Binary::spawn_with_env(bin, &args, &[("HOSTNAME", pod)], &log)?;
        Ok(Candidate {
            label,
            pod: pod.to_string(),
            process,
            log,
            metrics_port: ports[0],
        })
    }

    /// Waits until its metrics port accepts connections (the container is up), at most
    /// `timeout`.
    pub async fn wait_up(&mut self, timeout: Duration) -> Result<()> {
        let port = self.metrics_port;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(code) = self.process.exited() {
                anyhow::bail!(
                    "{} ({}) exited with {code:?} before it was up; log: {}",
                    self.label,
                    self.pod,
                    self.log.display()
                );
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "{} ({}) did not open its metrics port {port} within {timeout:?}; log: {}",
                self.label,
                self.pod,
                self.log.display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The scenario [`command_line`] reads: `role` with leader election, as gardenlet starts it.
fn gardener_scenario(role: Role) -> Scenario {
    Scenario {
        name: "swap",
        about: "the swap of issue 23",
        role,
        world: WorldSpec::seed_only(),
        config_edits: Vec::new(),
        leader_election: true,
        actions: Vec::new(),
        duration: 0.0,
        expect: Vec::new(),
    }
}

/// Who holds the `role`'s leader Lease in `garden` (`None`: no Lease or no holder).
pub async fn lease_holder(admin: &kube::Client, role: Role) -> Result<Option<String>> {
    let lease = Api::<Lease>::namespaced(admin.clone(), GARDEN)
        .get_opt(lease_name(role))
        .await
        .with_context(|| format!("get Lease {GARDEN}/{}", lease_name(role)))?;
    Ok(lease
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

/// Waits until someone other than `other` holds the Lease; the holder.
pub async fn wait_holder(
    admin: &kube::Client,
    role: Role,
    other: Option<&str>,
    timeout: Duration,
) -> Result<String> {
    let what = format!(
        "a holder of {GARDEN}/{} other than {other:?}",
        lease_name(role)
    );
    dwd_testenv::eventually(timeout, &what, || async {
        let holder = lease_holder(admin, role)
            .await
            .map_err(|e| format!("{e:#}"))?;
        Ok(holder.filter(|h| Some(h.as_str()) != other))
    })
    .await
    .map_err(|e| anyhow!(e))
}

/// What one hand-over did.
#[derive(Debug, Clone)]
pub struct Handover {
    /// The old pod's label.
    pub old: &'static str,
    /// The new pod's label.
    pub new: &'static str,
    /// When the old pod got SIGTERM.
    pub sigterm: DateTime<Utc>,
    /// When it was seen gone.
    pub exited: DateTime<Utc>,
    /// Its exit code (`None`: by a signal).
    pub exit_code: Option<i32>,
    /// Whether it needed the SIGKILL after the grace period.
    pub killed: bool,
    /// The Lease holder before (the old pod's identity).
    pub old_holder: String,
    /// The Lease holder after (the new pod's identity).
    pub new_holder: String,
    /// When the new pod was seen holding the Lease.
    pub acquired: DateTime<Utc>,
}

impl Handover {
    /// One line for the test's output.
    pub fn describe(&self) -> String {
        format!(
            "{} → {}: SIGTERM {}, exited {:.1}s later ({}), Lease {} → {} {:.1}s after the SIGTERM",
            self.old,
            self.new,
            self.sigterm.format("%H:%M:%S%.3f"),
            secs(self.exited - self.sigterm),
            match (self.killed, self.exit_code) {
                (true, _) => "SIGKILL after the grace period".to_string(),
                (false, Some(c)) => format!("exit code {c}"),
                (false, None) => "by a signal".to_string(),
            },
            self.old_holder,
            self.new_holder,
            secs(self.acquired - self.sigterm),
        )
    }
}

fn secs(d: chrono::TimeDelta) -> f64 {
    d.num_milliseconds() as f64 / 1000.0
}

/// The rolling update's last step: `new` (already started, a follower) takes over from `old`
/// ([`stop_old`], then [`Stopped::taken_over`] within `takeover`).
pub async fn hand_over(
    admin: &kube::Client,
    role: Role,
    old: &mut Candidate,
    new: &mut Candidate,
    takeover: Duration,
) -> Result<Handover> {
    stop_old(admin, role, old, new)
        .await?
        .taken_over(admin, role, new, takeover)
        .await
}

/// The old pod stopped, the new one not necessarily leading yet.
#[derive(Debug, Clone)]
pub struct Stopped {
    old: &'static str,
    sigterm: DateTime<Utc>,
    exited: DateTime<Utc>,
    exit_code: Option<i32>,
    killed: bool,
    old_holder: String,
}

/// Stops `old` as the kubelet stops a pod of a rolling update: SIGTERM and, if it still runs
/// after [`TERMINATION_GRACE`], SIGKILL. `new` must be running (a follower) and `old` holding
/// the Lease.
pub async fn stop_old(
    admin: &kube::Client,
    role: Role,
    old: &mut Candidate,
    new: &mut Candidate,
) -> Result<Stopped> {
    let old_holder = lease_holder(admin, role)
        .await?
        .with_context(|| format!("nobody holds the {role:?} Lease before the hand-over"))?;
    if let Some(code) = new.process.exited() {
        anyhow::bail!(
            "the new pod ({}, {}) exited with {code:?} before the hand-over; log: {}",
            new.label,
            new.pod,
            new.log.display()
        );
    }
    let sigterm = Utc::now();
    let mut exit_code = old.process.stop(TERMINATION_GRACE).await;
    let killed = old.process.exited().is_none();
    if killed {
        old.process.kill().await;
        exit_code = None;
    }
    Ok(Stopped {
        old: old.label,
        sigterm,
        exited: Utc::now(),
        exit_code,
        killed,
        old_holder,
    })
}

impl Stopped {
    /// Waits until `new` holds the Lease (someone other than the old holder), at most
    /// `takeover`.
    pub async fn taken_over(
        self,
        admin: &kube::Client,
        role: Role,
        new: &Candidate,
        takeover: Duration,
    ) -> Result<Handover> {
        let new_holder = wait_holder(admin, role, Some(&self.old_holder), takeover)
            .await
            .with_context(|| {
                format!(
                    "{} did not take over; log: {}",
                    new.label,
                    new.log.display()
                )
            })?;
        Ok(Handover {
            old: self.old,
            new: new.label,
            sigterm: self.sigterm,
            exited: self.exited,
            exit_code: self.exit_code,
            killed: self.killed,
            old_holder: self.old_holder,
            new_holder,
            acquired: Utc::now(),
        })
    }
}

// --- every version of every target ----------------------------------------------------------

/// One version of a Deployment, as a watch delivered it.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// When it was seen.
    pub at: DateTime<Utc>,
    /// Its namespace (the shoot).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// `spec.replicas` (1 when unset, as the apiserver defaults it).
    pub replicas: i32,
    /// The `replicas` annotation, if any.
    pub record: Option<String>,
    /// Whether the meltdown marker is set.
    pub marker: bool,
}

impl Observation {
    /// Reads a Deployment.
    pub fn of(d: &Deployment, at: DateTime<Utc>) -> Observation {
        Observation {
            at,
            namespace: d.namespace().unwrap_or_default(),
            name: d.name_any(),
            replicas: d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
            record: d.annotations().get(REPLICAS_ANNOTATION).cloned(),
            marker: d.annotations().contains_key(MELTDOWN_ANNOTATION),
        }
    }

    fn describe(&self) -> String {
        format!(
            "{} {}/{} replicas {} record {:?}{}",
            self.at.format("%H:%M:%S%.3f"),
            self.namespace,
            self.name,
            self.replicas,
            self.record,
            if self.marker { " marker" } else { "" }
        )
    }
}

/// A target's current state: `(namespace, name)` → the latest observation.
pub type TargetState = BTreeMap<(String, String), Observation>;

/// Every version of every Deployment of the seed since [`TargetWatch::start`].
pub struct TargetWatch {
    seen: Arc<Mutex<Vec<Observation>>>,
    _task: AbortOnDrop,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl TargetWatch {
    /// Starts one watch of Deployments in all namespaces through `client` (past the front
    /// door); a watch that ends is resumed (or re-listed) with kube's default backoff.
    pub fn start(client: kube::Client) -> TargetWatch {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let task = AbortOnDrop::spawn({
            let seen = seen.clone();
            async move {
                let api: Api<Deployment> = Api::all(client);
                let mut stream = watcher(api, watcher::Config::default())
                    .default_backoff()
                    .boxed();
                while let Some(event) = stream.next().await {
                    let now = Utc::now();
                    // Deletions and list markers carry no new version; errors are retried.
                    if let Ok(watcher::Event::Apply(d) | watcher::Event::InitApply(d)) = event {
                        lock(&seen).push(Observation::of(&d, now));
                    }
                }
            }
        });
        TargetWatch { seen, _task: task }
    }

    /// Everything seen so far, in the order seen.
    pub fn observations(&self) -> Vec<Observation> {
        lock(&self.seen).clone()
    }

    /// The latest version of every target.
    pub fn now(&self) -> TargetState {
        state_at(&lock(&self.seen), None)
    }

    /// The latest version of every target seen at or before `t`.
    pub fn at(&self, t: DateTime<Utc>) -> TargetState {
        state_at(&lock(&self.seen), Some(t))
    }

    /// Waits until `check` on the current state answers `Ok(true)`, at most `timeout`; an
    /// `Err` from `check` ends the wait at once (a state that can no longer come).
    pub async fn wait(
        &self,
        timeout: Duration,
        what: &str,
        check: impl Fn(&TargetState) -> Result<bool, String>,
    ) -> Result<TargetState> {
        let deadline = Instant::now() + timeout;
        loop {
            let now = self.now();
            match check(&now) {
                Ok(true) => return Ok(now),
                Ok(false) => {}
                Err(e) => anyhow::bail!("{what}: {e}\n{}", render_state(&now)),
            }
            ensure!(
                Instant::now() < deadline,
                "{what}: not within {timeout:?}\n{}",
                render_state(&now)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn state_at(seen: &[Observation], t: Option<DateTime<Utc>>) -> TargetState {
    let mut out = TargetState::new();
    for o in seen.iter().filter(|o| t.is_none_or(|t| o.at <= t)) {
        out.insert((o.namespace.clone(), o.name.clone()), o.clone());
    }
    out
}

/// One line per target.
pub fn render_state(state: &TargetState) -> String {
    state
        .values()
        .map(|o| format!("  {}\n", o.describe()))
        .collect()
}

/// `(replicas, record, marker)` of a target in `state`.
pub fn target<'a>(state: &'a TargetState, namespace: &str, name: &str) -> Option<&'a Observation> {
    state.get(&(namespace.to_string(), name.to_string()))
}

// --- the invariants -------------------------------------------------------------------------

/// Every version of a target at 0 replicas without the meltdown marker: gardenlet would take
/// it for its own and nothing would say it is owed a restore.
pub fn zero_without_marker(seen: &[Observation]) -> Vec<String> {
    seen.iter()
        .filter(|o| o.replicas == 0 && !o.marker)
        .map(|o| format!("at 0 without the marker: {}", o.describe()))
        .collect()
}

/// Per target, in the order seen: once the marker and a record are set, the record is never
/// lost or lowered while the marker stays, and the marker goes only with a restore to the
/// record. The first violation of each target.
pub fn records_kept(seen: &[Observation]) -> Vec<String> {
    let mut owed: BTreeMap<(String, String), i32> = BTreeMap::new();
    let mut violations: BTreeMap<(String, String), String> = BTreeMap::new();
    for o in seen {
        let key = (o.namespace.clone(), o.name.clone());
        if violations.contains_key(&key) {
            continue;
        }
        let record = o.record.as_deref().and_then(|r| r.parse::<i32>().ok());
        let violation = if o.marker {
            match (owed.get(&key).copied(), record) {
                (Some(v), Some(r)) if r < v => Some(format!("record lowered from {v}")),
                (Some(v), None) => Some(format!("record {v} lost")),
                (_, Some(r)) => {
                    owed.insert(key.clone(), r);
                    None
                }
                (None, None) if o.replicas == 0 => {
                    Some("at 0 under the marker without a record".to_string())
                }
                (None, None) => None,
            }
        } else {
            match owed.remove(&key) {
                Some(_) if o.replicas == 0 => Some("marker removed at 0".to_string()),
                Some(v) if o.replicas != v => {
                    Some(format!("restored to the wrong count (record {v})"))
                }
                _ => None,
            }
        };
        if let Some(v) = violation {
            violations.insert(key, format!("{v}: {}", o.describe()));
        }
    }
    violations.into_values().collect()
}

/// A successful write to a target (the Deployment or its `scale` subresource), read from the
/// audit log with its body.
#[derive(Debug, Clone)]
pub struct TargetWrite {
    /// The audit entry.
    pub entry: AuditEntry,
    /// The `spec.replicas` it set, if it set any.
    pub replicas: Option<i64>,
}

impl TargetWrite {
    /// One line for messages.
    pub fn describe(&self) -> String {
        let body = self
            .entry
            .request_object
            .as_ref()
            .map(|b| b.to_string())
            .unwrap_or_default();
        format!("{} {}", self.entry.describe(), truncate(&body, 300))
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(n).collect::<String>())
    }
}

/// The successful writes of `user` to Deployments (object or `scale`), oldest first.
pub fn target_writes(entries: &[AuditEntry], user: &str) -> Vec<TargetWrite> {
    let mut out: Vec<TargetWrite> = entries
        .iter()
        .filter(|e| {
            e.user == user
                && e.resource == "deployments"
                && (e.subresource.is_empty() || e.subresource == "scale")
                && (e.verb == "patch" || e.verb == "update")
                && e.stage == "ResponseComplete"
                && e.code.is_some_and(|c| (200..300).contains(&c))
        })
        .map(|e| TargetWrite {
            replicas: e.request_object.as_ref().and_then(|b| {
                // A `Scale` always sets replicas; Go leaves `"replicas": 0` out (omitempty).
                b["spec"]["replicas"]
                    .as_i64()
                    .or((e.subresource == "scale").then_some(0))
            }),
            entry: e.clone(),
        })
        .collect();
    // RFC 3339 with microseconds in UTC: the text sorts as the time.
    out.sort_by(|a, b| a.entry.received.cmp(&b.entry.received));
    out
}

/// Targets scaled twice: per target, the replica counts written must alternate between 0 and
/// a positive count (a second scale-down with no restore between, or a second restore, is a
/// target scaled twice).
pub fn scaled_twice(writes: &[TargetWrite]) -> Vec<String> {
    let mut last: BTreeMap<(String, String), &TargetWrite> = BTreeMap::new();
    let mut out = Vec::new();
    for w in writes {
        let Some(r) = w.replicas else { continue };
        let key = (w.entry.namespace.clone(), w.entry.name.clone());
        if let Some(prev) = last.get(&key)
            && (prev.replicas == Some(0)) == (r == 0)
        {
            out.push(format!(
                "scaled twice:\n    {}\n    {}",
                prev.describe(),
                w.describe()
            ));
        }
        last.insert(key, w);
    }
    out
}

/// Every Event of the seed (core/v1 and `events.k8s.io/v1`, all namespaces) about an object in
/// `namespace`, about its Cluster (named like the namespace), or naming it in its message.
pub async fn events_naming(admin: &kube::Client, namespace: &str) -> Result<Vec<String>> {
    let lp = ListParams::default();
    let mut out = Vec::new();
    for e in Api::<CoreEvent>::all(admin.clone())
        .list(&lp)
        .await
        .context("list core/v1 Events")?
        .items
    {
        let o = &e.involved_object;
        let message = e.message.clone().unwrap_or_default();
        if o.namespace.as_deref() == Some(namespace)
            || o.name.as_deref() == Some(namespace)
            || message.contains(namespace)
        {
            out.push(format!(
                "core/v1 {}/{} {}: {message}",
                e.namespace().unwrap_or_default(),
                e.name_any(),
                e.reason.unwrap_or_default()
            ));
        }
    }
    for e in Api::<NewEvent>::all(admin.clone())
        .list(&lp)
        .await
        .context("list events.k8s.io/v1 Events")?
        .items
    {
        let regarding = e.regarding.clone().unwrap_or_default();
        let note = e.note.clone().unwrap_or_default();
        if regarding.namespace.as_deref() == Some(namespace)
            || regarding.name.as_deref() == Some(namespace)
            || note.contains(namespace)
        {
            out.push(format!(
                "events.k8s.io {}/{} {}: {note}",
                e.namespace().unwrap_or_default(),
                e.name_any(),
                e.reason.unwrap_or_default()
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn obs(t: i64, name: &str, replicas: i32, record: Option<&str>, marker: bool) -> Observation {
        Observation {
            at: DateTime::from_timestamp(t, 0).unwrap(),
            namespace: "shoot--p--a".to_string(),
            name: name.to_string(),
            replicas,
            record: record.map(str::to_string),
            marker,
        }
    }

    #[test]
    fn the_references_two_step_and_our_one_step_flows_keep_every_record() {
        let seen = [
            // The reference: annotations first, then the scale; up: scale, then the marker.
            obs(0, "kcm", 2, None, false),
            obs(1, "kcm", 2, Some("2"), true),
            obs(2, "kcm", 0, Some("2"), true),
            obs(3, "kcm", 2, Some("2"), true),
            obs(4, "kcm", 2, Some("2"), false),
            // Ours: one patch each way.
            obs(5, "mcm", 1, None, false),
            obs(6, "mcm", 0, Some("1"), true),
            obs(7, "mcm", 1, None, false),
            // A leftover record on a running target, never touched.
            obs(8, "ca", 1, Some("3"), false),
        ];
        assert!(zero_without_marker(&seen).is_empty());
        assert!(records_kept(&seen).is_empty(), "{:?}", records_kept(&seen));
    }

    #[test]
    fn a_lost_or_lowered_record_a_wrong_restore_and_a_bare_zero_are_reported() {
        let lowered = [
            obs(0, "kcm", 0, Some("2"), true),
            obs(1, "kcm", 0, Some("0"), true),
        ];
        assert!(records_kept(&lowered)[0].contains("record lowered from 2"));
        let lost = [
            obs(0, "kcm", 0, Some("2"), true),
            obs(1, "kcm", 0, None, true),
        ];
        assert!(records_kept(&lost)[0].contains("record 2 lost"));
        let wrong = [
            obs(0, "kcm", 0, Some("2"), true),
            obs(1, "kcm", 1, None, false),
        ];
        assert!(records_kept(&wrong)[0].contains("restored to the wrong count (record 2)"));
        let unmarked = [
            obs(0, "kcm", 0, Some("2"), true),
            obs(1, "kcm", 0, Some("2"), false),
        ];
        assert!(records_kept(&unmarked)[0].contains("marker removed at 0"));
        assert_eq!(zero_without_marker(&unmarked).len(), 1);
        let bare = [obs(0, "kcm", 0, None, true)];
        assert!(records_kept(&bare)[0].contains("without a record"));
    }

    fn write(t: &str, name: &str, subresource: &str, body: Value) -> AuditEntry {
        AuditEntry {
            user: "sa".to_string(),
            verb: if subresource == "scale" {
                "update"
            } else {
                "patch"
            }
            .to_string(),
            api_group: "apps".to_string(),
            resource: "deployments".to_string(),
            subresource: subresource.to_string(),
            namespace: "shoot--p--a".to_string(),
            name: name.to_string(),
            uri: String::new(),
            stage: "ResponseComplete".to_string(),
            code: Some(200),
            received: t.to_string(),
            user_agent: String::new(),
            request_object: Some(body),
        }
    }

    #[test]
    fn writes_alternating_down_and_up_are_fine_a_repeated_direction_is_scaled_twice() {
        use serde_json::json;
        let annotate = json!({"metadata": {"annotations": {"m": ""}}});
        let entries = [
            write("2026-01-01T00:00:01.000000Z", "kcm", "", annotate.clone()),
            // The reference's scale-down: Go leaves `replicas: 0` out of the Scale.
            write(
                "2026-01-01T00:00:02.000000Z",
                "kcm",
                "scale",
                json!({"spec": {}}),
            ),
            write(
                "2026-01-01T00:00:03.000000Z",
                "kcm",
                "",
                json!({"spec": {"replicas": 2}}),
            ),
            write(
                "2026-01-01T00:00:04.000000Z",
                "mcm",
                "",
                json!({"spec": {"replicas": 0}}),
            ),
        ];
        let writes = target_writes(&entries, "sa");
        assert_eq!(writes.len(), 4);
        let set: Vec<Option<i64>> = writes.iter().map(|w| w.replicas).collect();
        assert_eq!(set, [None, Some(0), Some(2), Some(0)]);
        assert!(scaled_twice(&writes).is_empty());
        assert!(target_writes(&entries, "someone else").is_empty());
        let twice = [
            write(
                "2026-01-01T00:00:02.000000Z",
                "kcm",
                "",
                json!({"spec": {"replicas": 0}}),
            ),
            write(
                "2026-01-01T00:00:01.000000Z",
                "kcm",
                "",
                json!({"spec": {"replicas": 2}}),
            ),
            write(
                "2026-01-01T00:00:03.000000Z",
                "kcm",
                "scale",
                json!({"spec": {"replicas": 0}}),
            ),
        ];
        let found = scaled_twice(&target_writes(&twice, "sa"));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("00:00:02") && found[0].contains("00:00:03"));
    }
}
