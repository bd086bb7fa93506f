//! The drop-in, proven: the real binary run exactly as gardenlet deploys the reference
//! (`deploy/gardener/`), against a real seed and a real shoot kube-apiserver.
//!
//! - Seed credential: a token of the ServiceAccount `garden/dependency-watchdog-{prober,weeder}`
//!   from the TokenRequest API, bound to exactly Gardener's ClusterRole and Role (no
//!   `events.k8s.io`, core/v1 events in `garden` only). The binary gets it through `KUBECONFIG`
//!   so that its command line stays Gardener's, flag for flag (in a pod it is the in-cluster
//!   config; `tests/image.rs` runs that case from the image's root filesystem).
//! - Shoot credential: the probe kubeconfig in `shoot-access-dependency-watchdog-probe` carries a
//!   bearer token of the shoot's `kube-system/dependency-watchdog-probe` ServiceAccount, which
//!   has Gardener's shoot-side rights only (get/list leases in `kube-node-lease`, get/list
//!   nodes). A token-requestor stand-in replaces the token every [`ROTATION`] and revokes the
//!   token before the previous one, so a prober that kept an old token would fail; not a single
//!   probe run may fail.
//! - Gardener's config with only its intervals shortened (said in [`shortened`]): an outage
//!   scales MCM and CA (level 0) down before KCM (level 1); recovery brings KCM up first, MCM
//!   its `initialDelay` later, CA last.
//! - The weeder, with Gardener's config unchanged, deletes the crash-looping dependants of both
//!   of Gardener's services and nothing else.
//! - Every decision and deletion is a core/v1 Event about the watchdog's own pod in `garden`
//!   (what Gardener's RBAC allows); the refused `events.k8s.io` events are counted and warned
//!   about once. Nothing else is logged at warn or above.
//!
//! The binaries bind the default ports (Gardener passes no bind address), so the two tests of
//! this file take turns ([`PORTS`]).

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use dwd_core::scaling::{MELTDOWN_ANNOTATION, REPLICAS_ANNOTATION};
use dwd_sim::{EndpointsState, SeedControlPlane, SimShoot, SimShootOptions};
use dwd_testenv::{ApiServer, ApiServerOptions, TestEnv};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Event, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

mod harness;
use harness::binary::{Watchdog, http_get, sum};
use harness::gardener::{GARDEN, Gardener, apply, ensure_namespace, fixture, one, shortened};

const KCM: &str = "kube-controller-manager";
const MCM: &str = "machine-controller-manager";
const CA: &str = "cluster-autoscaler";
const PROBE_SECRET: &str = "shoot-access-dependency-watchdog-probe";
const PROBE_SA: &str = "dependency-watchdog-probe";
const KUBE_SYSTEM: &str = "kube-system";
/// How often the token-requestor stand-in replaces the probe token.
const ROTATION: Duration = Duration::from_secs(2);
/// Gardener's MCM scale-up `initialDelay` (30 s), shortened for the test.
const MCM_UP_DELAY: Duration = Duration::from_secs(3);
/// The default metrics and health ports, which Gardener's command line leaves in place.
const METRICS_PORT: u16 = 9643;
const HEALTH_PORT: u16 = 9644;

/// Both binaries bind the default ports: one test at a time.
static PORTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// --- the fixtures ---------------------------------------------------------------------------

/// A token of `namespace/sa`, optionally bound to a Secret (deleting it revokes the token).
async fn token(
    admin: &kube::Client,
    namespace: &str,
    sa: &str,
    bound_to: Option<&Secret>,
) -> Result<String> {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(3600),
            bound_object_ref: bound_to.map(|s| BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Secret".into()),
                name: s.metadata.name.clone(),
                uid: s.metadata.uid.clone(),
            }),
        },
        ..TokenRequest::default()
    };
    let answer: TokenRequest = Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .create_subresource("token", sa, &PostParams::default(), &request)
        .await
        .with_context(|| format!("TokenRequest for {namespace}/{sa}"))?;
    Ok(answer.status.context("TokenRequest without status")?.token)
}

// --- the world ------------------------------------------------------------------------------

struct World {
    env: TestEnv,
    seed: ApiServer,
    admin: kube::Client,
    dir: PathBuf,
}

async fn world(name: &str) -> Result<World> {
    let env = TestEnv::start().await?;
    let seed = env
        .start_apiserver_with(&format!("{name}-seed"), ApiServerOptions::seed())
        .await?;
    let admin = seed.client().await?;
    ensure_namespace(&admin, GARDEN).await?;
    let dir = env.dir().join(format!("{name}-test"));
    std::fs::create_dir_all(&dir)?;
    Ok(World {
        env,
        seed,
        admin,
        dir,
    })
}

impl World {
    /// Gardener's RBAC for `role` applied; a kubeconfig file with its ServiceAccount's token.
    async fn identity(&self, gardener: &Gardener, role: &str) -> Result<PathBuf> {
        gardener.apply_rbac(&self.admin).await?;
        let sa = gardener.service_account()?.name_any();
        let token = token(&self.admin, GARDEN, &sa, None).await?;
        let path = self.dir.join(format!("{role}.kubeconfig"));
        std::fs::write(&path, self.seed.kubeconfig_with_token(&token))?;
        Ok(path)
    }
}

/// The shoot side of the probe identity: Gardener's RBAC for `kube-system/dependency-watchdog-probe`
/// and a token-requestor stand-in that keeps the seed's probe secret supplied with fresh tokens.
#[derive(Clone)]
struct TokenIssuer {
    shoot: ApiServer,
    admin: kube::Client,
}

impl TokenIssuer {
    /// Applies Gardener's shoot-side RBAC of the probe identity.
    async fn new(shoot: &ApiServer) -> Result<TokenIssuer> {
        let admin = shoot.client().await?;
        let docs = fixture("shoot-access.yaml")?;
        let sa: ServiceAccount = serde_json::from_value(serde_json::json!({
            "metadata": {"name": PROBE_SA, "namespace": KUBE_SYSTEM}
        }))?;
        apply(&Api::namespaced(admin.clone(), KUBE_SYSTEM), &sa).await?;
        let lease_ns = "kube-node-lease";
        apply::<Role>(
            &Api::namespaced(admin.clone(), lease_ns),
            &one(&docs, "Role")?,
        )
        .await?;
        apply::<RoleBinding>(
            &Api::namespaced(admin.clone(), lease_ns),
            &one(&docs, "RoleBinding")?,
        )
        .await?;
        apply::<ClusterRole>(&Api::all(admin.clone()), &one(&docs, "ClusterRole")?).await?;
        apply::<ClusterRoleBinding>(&Api::all(admin.clone()), &one(&docs, "ClusterRoleBinding")?)
            .await?;
        Ok(TokenIssuer {
            shoot: shoot.clone(),
            admin,
        })
    }

    fn bindings(&self) -> Api<Secret> {
        Api::namespaced(self.admin.clone(), KUBE_SYSTEM)
    }

    /// Probe kubeconfig number `n`: a new token bound to a Secret of its own.
    async fn issue(&self, n: u64) -> Result<String> {
        let binding: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("dwd-probe-token-{n}")}
        }))?;
        let binding = self
            .bindings()
            .create(&PostParams::default(), &binding)
            .await?;
        let token = token(&self.admin, KUBE_SYSTEM, PROBE_SA, Some(&binding)).await?;
        Ok(self.shoot.kubeconfig_with_token(&token))
    }

    /// Revokes the token of kubeconfig number `n`.
    async fn revoke(&self, n: u64) -> Result<()> {
        self.bindings()
            .delete(&format!("dwd-probe-token-{n}"), &DeleteParams::default())
            .await?;
        Ok(())
    }

    /// Replaces the token in `seed`'s probe secret every [`ROTATION`] (kubeconfig 0 is already
    /// there) and revokes the token before the previous one.
    fn rotate(self, seed: SeedControlPlane) -> TokenRequestor {
        let rotations = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let task = tokio::spawn({
            let rotations = rotations.clone();
            async move {
                for n in 1.. {
                    tokio::time::sleep(ROTATION).await;
                    let kubeconfig = self.issue(n).await?;
                    seed.rotate_probe_secret(PROBE_SECRET, &kubeconfig).await?;
                    rotations.store(n, std::sync::atomic::Ordering::SeqCst);
                    if n >= 2 {
                        self.revoke(n - 2).await?;
                    }
                }
                Ok(())
            }
        });
        TokenRequestor { rotations, task }
    }
}

/// The running rotation.
struct TokenRequestor {
    rotations: Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<Result<()>>,
}

impl TokenRequestor {
    fn rotations(&self) -> u64 {
        self.rotations.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Fails if the rotation stopped (it only stops on an error).
    fn check(&self) -> Result<()> {
        ensure!(!self.task.is_finished(), "the token rotation stopped");
        Ok(())
    }
}

impl Drop for TokenRequestor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// --- the binary -----------------------------------------------------------------------------

/// Starts Gardener's `command` (its `--config-file` pointing at `config` instead of the
/// ConfigMap mount) with the seed credential in `KUBECONFIG` and `pod` as host name.
fn start_as_gardener(
    command: &[String],
    pod: &str,
    dir: &Path,
    config: &Path,
    kubeconfig: &Path,
) -> Result<Watchdog> {
    ensure!(
        command.first().map(String::as_str) == Some("/usr/local/bin/dependency-watchdog"),
        "Gardener's command starts with {:?}",
        command.first()
    );
    let args: Vec<String> = command[1..]
        .iter()
        .map(|arg| {
            if arg.starts_with("--config-file=") {
                format!("--config-file={}", config.display())
            } else {
                arg.clone()
            }
        })
        .collect();
    let kubeconfig = kubeconfig.display().to_string();
    // In a pod the host name is the pod's name; Gardener sets no POD_NAME.
    let env = [("KUBECONFIG", kubeconfig.as_str()), ("HOSTNAME", pod)];
    Watchdog::spawn(pod, &args, &env, dir, METRICS_PORT)
}

/// Gardener's RBAC does not allow the core/v1 copy of events: the one warning a run logs.
fn only_the_refused_events_warning(wd: &Watchdog) -> Result<()> {
    let warnings = wd.warnings();
    ensure!(
        warnings.len() == 1 && warnings[0].contains("not allowed by this ServiceAccount's RBAC"),
        "warnings other than the one about refused events:\n{}",
        warnings.join("\n")
    );
    Ok(())
}

/// SIGTERM: the binary exits 0.
async fn stops_cleanly(wd: &Watchdog) -> Result<()> {
    let status = wd.stop().await?;
    ensure!(status.success(), "exit status {status}\n{}", wd.tail());
    Ok(())
}

/// Who holds `garden/<name>`, if anyone.
async fn lease_holder(admin: &kube::Client, name: &str) -> Result<Option<String>> {
    harness::in_process::lease_holder(admin, GARDEN, name).await
}

/// The core/v1 Events in `garden` about pod `pod` with `reason`.
async fn pod_events(admin: &kube::Client, pod: &str, reason: &str) -> Result<Vec<Event>> {
    Ok(Api::<Event>::namespaced(admin.clone(), GARDEN)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.involved_object.kind.as_deref() == Some("Pod")
                && e.involved_object.name.as_deref() == Some(pod)
        })
        .collect())
}

/// Replica changes of the targets in one namespace, in the order they happened (polled).
struct ReplicaLog {
    changes: Arc<Mutex<Vec<(Instant, String, i32)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ReplicaLog {
    fn start(admin: kube::Client, namespace: &str) -> ReplicaLog {
        let changes = Arc::new(Mutex::new(Vec::new()));
        let api: Api<Deployment> = Api::namespaced(admin, namespace);
        let task = tokio::spawn({
            let changes = changes.clone();
            async move {
                let mut last: BTreeMap<String, i32> = BTreeMap::new();
                loop {
                    if let Ok(list) = api.list(&ListParams::default()).await {
                        let now = Instant::now();
                        for d in list.items {
                            let name = d.name_any();
                            let replicas = d.spec.and_then(|s| s.replicas).unwrap_or(1);
                            if last.insert(name.clone(), replicas) != Some(replicas) {
                                changes
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .push((now, name, replicas));
                            }
                        }
                    }
                    // A recorder's sampling period, not a wait for a condition.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        });
        ReplicaLog { changes, task }
    }

    /// The replicas `target` had when last seen.
    fn latest(&self, target: &str) -> Option<i32> {
        self.changes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .rev()
            .find(|(_, name, _)| name == target)
            .map(|(_, _, r)| *r)
    }

    /// When `target` last changed to `replicas`, if it did.
    fn when(&self, target: &str, replicas: impl Fn(i32) -> bool) -> Option<Instant> {
        self.changes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .rev()
            .find(|(_, name, r)| name == target && replicas(*r))
            .map(|(t, _, _)| *t)
    }
}

impl Drop for ReplicaLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn replicas(
    admin: &kube::Client,
    ns: &str,
    name: &str,
) -> Result<(i32, BTreeMap<String, String>)> {
    let d = Api::<Deployment>::namespaced(admin.clone(), ns)
        .get(name)
        .await?;
    Ok((
        d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
        d.metadata.annotations.unwrap_or_default(),
    ))
}

// --- the prober -----------------------------------------------------------------------------

/// Waits until shoot `ns` has had `min` probe runs.
async fn wait_probe_runs(wd: &Watchdog, ns: &str, min: f64) -> Result<()> {
    wd.until(&format!("{min} probe runs"), || async {
        let m = wd.metrics().await?;
        Ok((sum(&m, "dwd_prober_shoot_probe_runs_total", &[("shoot", ns)]) >= min).then_some(()))
    })
    .await
}

/// MCM and CA (scale-down level 0) went down no later than KCM (level 1), as the replica log
/// saw it: its times are what the order is judged by.
fn check_scale_down_order(replica_log: &ReplicaLog) -> Result<()> {
    let down = |t: &str| {
        replica_log
            .when(t, |r| r == 0)
            .context("no scale-down seen")
    };
    let (kcm_down, mcm_down, ca_down) = (down(KCM)?, down(MCM)?, down(CA)?);
    ensure!(
        mcm_down <= kcm_down && ca_down <= kcm_down,
        "scale-down order: MCM {:?}, CA {:?} after KCM",
        mcm_down.saturating_duration_since(kcm_down),
        ca_down.saturating_duration_since(kcm_down)
    );
    Ok(())
}

/// KCM (scale-up level 0) came back first, MCM (level 1) at least its initialDelay later, CA
/// last, as the replica log saw it.
fn check_scale_up_order(replica_log: &ReplicaLog) -> Result<()> {
    let up = |t: &str| replica_log.when(t, |r| r > 0).context("no scale-up seen");
    let (kcm_up, mcm_up, ca_up) = (up(KCM)?, up(MCM)?, up(CA)?);
    ensure!(
        mcm_up.duration_since(kcm_up) >= MCM_UP_DELAY.saturating_sub(Duration::from_millis(200))
            && ca_up >= mcm_up,
        "scale-up order: KCM, then MCM {:?} later (want ≥ {MCM_UP_DELAY:?}), then CA {:?} after MCM",
        mcm_up.saturating_duration_since(kcm_up),
        ca_up.saturating_duration_since(mcm_up)
    );
    Ok(())
}

/// Not one API-server or lease probe of shoot `ns` failed over `rotations` token rotations
/// (which only the message reports).
async fn check_no_probe_failures(wd: &Watchdog, ns: &str, rotations: u64) -> Result<()> {
    let m = wd.metrics().await?;
    let runs = sum(&m, "dwd_prober_shoot_probe_runs_total", &[("shoot", ns)]);
    let api_failures = sum(
        &m,
        "dwd_prober_api_server_probe_failures_total",
        &[("shoot", ns)],
    );
    let lease_failures = sum(
        &m,
        "dwd_prober_lease_probe_failures_total",
        &[("shoot", ns)],
    );
    ensure!(
        api_failures == 0.0 && lease_failures == 0.0,
        "{api_failures} API-server and {lease_failures} lease probe failures in {runs} runs over \
         {rotations} token rotations\n{}",
        wd.tail()
    );
    Ok(())
}

/// The scaling story as core/v1 Events about the prober's `pod` in garden (a ScaledDown one
/// naming each target), and the refused events.k8s.io ones counted, none failed.
async fn check_scaling_events(
    wd: &Watchdog,
    admin: &kube::Client,
    pod: &str,
    ns: &str,
) -> Result<()> {
    for reason in ["ScaleDown", "ScaledDown", "ScaleUp", "ScaledUp"] {
        wd.until(&format!("a {reason} event about pod {pod}"), || async {
            Ok((!pod_events(admin, pod, reason).await?.is_empty()).then_some(()))
        })
        .await?;
    }
    let scaled_down = pod_events(admin, pod, "ScaledDown").await?;
    let messages: Vec<&str> = scaled_down
        .iter()
        .filter_map(|e| e.message.as_deref())
        .collect();
    for target in [KCM, MCM, CA] {
        ensure!(
            messages
                .iter()
                .any(|m| m.starts_with(&format!("Deployment {ns}/{target}: scaled down"))),
            "no ScaledDown event naming {target}: {messages:?}"
        );
    }
    let m = wd.metrics().await?;
    ensure!(
        sum(&m, "dwd_events_total", &[("outcome", "Refused")]) > 0.0
            && sum(&m, "dwd_events_total", &[("outcome", "Failed")]) == 0.0,
        "events: {}",
        m.lines()
            .filter(|l| l.starts_with("dwd_events_total"))
            .collect::<Vec<_>>()
            .join("; ")
    );
    Ok(())
}

#[tokio::test]
async fn prober_runs_under_gardeners_rbac_config_command_line_and_rotating_tokens() -> Result<()> {
    let _ports = PORTS.lock().await;
    let w = world("gardener-prober").await?;
    let gardener = Gardener::load("prober")?;
    let kubeconfig = w.identity(&gardener, "prober").await?;
    let config = w.dir.join("dep-config.yaml");
    std::fs::write(&config, shortened(&gardener.config()?, MCM_UP_DELAY)?)?;

    // A shoot with 5 nodes whose probe secret is fed by the token requestor.
    let shoot_api = w.env.start_apiserver("gardener-shoot").await?;
    let ns = "shoot--garden--drop-in";
    let issuer = TokenIssuer::new(&shoot_api).await?;
    let shoot = SimShoot::create(
        w.admin.clone(),
        shoot_api.client().await?,
        &issuer.issue(0).await?,
        SimShootOptions::new(ns)
            .with_nodes(5)
            .with_renew_interval(Duration::from_millis(500)),
    )
    .await?;
    let requestor = issuer.rotate(shoot.seed().clone());
    let replica_log = ReplicaLog::start(w.admin.clone(), ns);

    let pod = "dependency-watchdog-prober-5d4c7b9f8-x2x7q";
    let wd = start_as_gardener(&gardener.command()?, pod, &w.dir, &config, &kubeconfig)?;
    wd.until("the prober leads", || async {
        // The holder is `<kernel host name>_<uuid>`, as controller-runtime's.
        Ok(lease_holder(&w.admin, "dwd-prober-leader-election")
            .await?
            .map(|_| ()))
    })
    .await?;

    // Healthy: probe runs succeed while the token is replaced under them.
    wait_probe_runs(&wd, ns, 5.0).await?;
    let rotated_before_outage = requestor.rotations();

    // Outage: 4 of 5 kubelets silent → MCM and CA (level 0) down before KCM (level 1).
    let silenced = shoot.kubelets().silence_count(4);
    ensure!(silenced.len() == 4);
    wd.until("KCM, MCM and CA at 0", || async {
        // As the replica log saw it: its times are what the order is judged by.
        let all = [KCM, MCM, CA]
            .iter()
            .all(|t| replica_log.latest(t) == Some(0));
        Ok(all.then_some(()))
    })
    .await?;
    check_scale_down_order(&replica_log)?;
    for (target, recorded) in [(KCM, "2"), (MCM, "1"), (CA, "1")] {
        let (_, annotations) = replicas(&w.admin, ns, target).await?;
        ensure!(
            annotations.get(REPLICAS_ANNOTATION).map(String::as_str) == Some(recorded)
                && annotations.contains_key(MELTDOWN_ANNOTATION),
            "{target} annotations during the outage: {annotations:?}"
        );
    }

    // Recovery: KCM (level 0) first, MCM (level 1) at least its initialDelay later, CA last.
    shoot.kubelets().resume_all();
    wd.until("KCM 2, MCM 1, CA 1 without annotations", || async {
        let mut all = true;
        for (target, want) in [(KCM, 2), (MCM, 1), (CA, 1)] {
            let (r, annotations) = replicas(&w.admin, ns, target).await?;
            all &= r == want
                && replica_log.latest(target) == Some(want)
                && !annotations.contains_key(MELTDOWN_ANNOTATION)
                && !annotations.contains_key(REPLICAS_ANNOTATION);
        }
        Ok(all.then_some(()))
    })
    .await?;
    check_scale_up_order(&replica_log)?;

    // The token was replaced all along, old ones revoked, and not one probe run failed.
    requestor.check()?;
    let rotations = requestor.rotations();
    ensure!(
        rotations >= rotated_before_outage + 3 && rotations >= 5,
        "only {rotations} token rotations"
    );
    check_no_probe_failures(&wd, ns, rotations).await?;

    // The story as core/v1 Events about the pod in garden; the refused events.k8s.io ones
    // counted and warned about once; nothing else at warn or above.
    check_scaling_events(&wd, &w.admin, pod, ns).await?;
    only_the_refused_events_warning(&wd)?;

    // Shutdown: exit 0, Lease handed over.
    stops_cleanly(&wd).await
}

// --- the weeder -----------------------------------------------------------------------------

/// Waits for the two deletions as core/v1 Events about the weeder's `pod` in garden, one
/// naming each deleted pod.
async fn wait_deletion_events(
    wd: &Watchdog,
    admin: &kube::Client,
    pod: &str,
    ns: &str,
) -> Result<()> {
    let deleted = wd
        .until("two deletion events about the pod", || async {
            let found = pod_events(admin, pod, "CrashLoopingPodDeleted").await?;
            Ok((found.len() >= 2).then_some(found))
        })
        .await?;
    let messages: Vec<&str> = deleted
        .iter()
        .filter_map(|e| e.message.as_deref())
        .collect();
    for victim in ["kube-apiserver-7d9c", "kube-controller-manager-5f6d"] {
        ensure!(
            messages
                .iter()
                .any(|m| m.starts_with(&format!("Pod {ns}/{victim}: deleted"))),
            "no deletion event naming {victim}: {messages:?}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn weeder_runs_under_gardeners_rbac_config_and_command_line() -> Result<()> {
    let _ports = PORTS.lock().await;
    let w = world("gardener-weeder").await?;
    let gardener = Gardener::load("weeder")?;
    let kubeconfig = w.identity(&gardener, "weeder").await?;
    // Gardener's weeder config as it is.
    let config = w.dir.join("dep-config.yaml");
    std::fs::write(&config, gardener.config()?)?;

    let ns = "shoot--garden--weeder";
    let plane = SeedControlPlane::new(w.admin.clone(), ns);
    plane.create_namespace().await?;
    let controlplane = ("gardener.cloud/role", "controlplane");
    plane
        .create_crashlooping_pod(
            "kube-apiserver-7d9c",
            &[controlplane, ("role", "apiserver")],
        )
        .await?;
    plane
        .create_crashlooping_pod(
            "kube-controller-manager-5f6d",
            &[controlplane, ("role", "controller-manager")],
        )
        .await?;
    // etcd itself depends on neither service: never weeded.
    plane
        .create_crashlooping_pod("etcd-main-0", &[controlplane, ("role", "main")])
        .await?;
    plane
        .set_endpoint_slice("etcd-main-client", 1, EndpointsState::NotReady)
        .await?;
    plane
        .set_endpoint_slice("kube-apiserver", 1, EndpointsState::NotReady)
        .await?;

    let pod = "dependency-watchdog-weeder-6c8f9d7b4-q9w2e";
    let wd = start_as_gardener(&gardener.command()?, pod, &w.dir, &config, &kubeconfig)?;
    wd.until("the weeder leads and is ready", || async {
        let leads = lease_holder(&w.admin, "dwd-weeder-leader-election")
            .await?
            .is_some();
        let ready = http_get(HEALTH_PORT, "/readyz")
            .await
            .map(|(s, _)| s == 200)
            .unwrap_or(false);
        Ok((leads && ready).then_some(()))
    })
    .await?;
    let pods: Api<Pod> = Api::namespaced(w.admin.clone(), ns);
    let exists = |name: &'static str| {
        let pods = pods.clone();
        async move { Ok::<_, anyhow::Error>(pods.get_opt(name).await?.is_some()) }
    };

    // etcd back → the kube-apiserver pod goes; the others stay.
    plane
        .set_endpoint_slice("etcd-main-client", 1, EndpointsState::AllReady)
        .await?;
    wd.until("kube-apiserver pod deleted", || async {
        Ok((!exists("kube-apiserver-7d9c").await?).then_some(()))
    })
    .await?;
    ensure!(
        exists("kube-controller-manager-5f6d").await?,
        "KCM pod deleted for etcd"
    );
    // kube-apiserver back → the controller-manager pod goes; etcd stays.
    plane
        .set_endpoint_slice("kube-apiserver", 1, EndpointsState::AllReady)
        .await?;
    wd.until("kube-controller-manager pod deleted", || async {
        Ok((!exists("kube-controller-manager-5f6d").await?).then_some(()))
    })
    .await?;
    ensure!(exists("etcd-main-0").await?, "the etcd pod was deleted");

    // Both deletions as core/v1 Events about the weeder's pod in garden.
    wait_deletion_events(&wd, &w.admin, pod, ns).await?;
    only_the_refused_events_warning(&wd)?;
    stops_cleanly(&wd).await
}
