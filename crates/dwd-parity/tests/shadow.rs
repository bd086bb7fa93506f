//! Shadow mode next to the acting reference (issue 16), on real kube-apiservers.
//!
//! On one seed with an audit log, the **reference** (Gardener's v1.7.0, found or built by
//! `dwd_testenv::reference::binary`) acts: Gardener's command line and config (intervals
//! shortened, as every parity scenario runs it), leader election on as gardenlet starts it, as a
//! user of its own (`dwd-reference`, in `system:masters`). **Ours** runs beside it with the
//! command line of `deploy/shadow/<role>.yaml` (Gardener's plus `--shadow`), the same config,
//! a 30 s `--shadow-window` (the reference's scale-up flow ends seconds after ours decides; a
//! loaded machine stretches that), and a token of the shipped ServiceAccount bound to exactly the
//! shipped read-only RBAC objects.
//!
//! - `shadow_prober_next_to_the_reference`: an outage both catch (kubelets silenced → the
//!   reference scales down; ours reports `agree` for `scale_down` with the lag; kubelets back →
//!   `agree` for `scale_up`), then a case only the reference acts on (README "Where we differ":
//!   a Shoot `nodeMonitorGracePeriod` of `0s` — the reference scales a healthy shoot down, ours
//!   ignores the value → `only_reference`, with our latest finding as the evidence).
//! - `shadow_weeder_next_to_the_reference`: a service comes back while both weeders watch its
//!   dependants (seen in the audit log), then a dependant crash-loops → the reference deletes it,
//!   ours reports `agree` for `delete_pod`.
//!
//! Each then reads the seed's audit log: no request of the shadow's user changes anything but
//! core/v1 Events in `garden` (and those exist: the check sees the user), none of its requests
//! was refused (the shipped RBAC is enough), it never touches a Lease, and every write to a
//! target (or deletion of a pod) is the reference's.
//!
//! Our binary is built by cargo first (or `DWD_PARITY_OURS`); 35-60 s on 2 cores with
//! both binaries built.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use dwd_parity::runner::Binary;
use dwd_parity::scenario::{CA, ConfigEdit, KCM, MCM, Role, Scenario, WorldSpec};
use dwd_parity::shadow::{
    AuditEntry, ShadowManifests, apply_all, find_record, flush_audit, gardener_args, http_get,
    read_audit, records, service_account_kubeconfig,
};
use dwd_parity::world::{GARDEN, Lane, command_line, gardener_config, lease_name, shortened};
use dwd_sim::{EndpointsState, SeedControlPlane, ShootState};
use dwd_testenv::{ApiServerOptions, TestEnv};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ListParams};
use serde_json::Value;

/// How long one side's action waits for the other's in ours.
const WINDOW: &str = "30s";
/// The reference's identity on the seed.
const REFERENCE_USER: &str = "dwd-reference";
/// How long a binary may take to exit after SIGTERM.
const EXIT: Duration = Duration::from_secs(20);

async fn env() -> Result<&'static TestEnv> {
    static ENV: tokio::sync::OnceCell<TestEnv> = tokio::sync::OnceCell::const_new();
    Ok(ENV.get_or_try_init(TestEnv::start).await?)
}

fn reference() -> Result<PathBuf> {
    dwd_testenv::reference::binary().map_err(|e| anyhow!("{e}"))
}

/// Waits until `check` answers `Some`, at most `secs`.
async fn until<T, F, Fut>(secs: u64, what: &str, check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, String>>,
{
    dwd_testenv::eventually(Duration::from_secs(secs), what, check)
        .await
        .map_err(|e| anyhow!(e))
}

fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
    Ok(path)
}

/// The shipped shadow Deployment runs Gardener's command line without leader election, plus
/// `--shadow`.
fn check_command_line(manifests: &ShadowManifests) -> Result<()> {
    let mut want: Vec<String> = gardener_args(manifests.role)?
        .into_iter()
        .filter(|a| !a.starts_with("--enable-leader-election"))
        .collect();
    want.push("--shadow".to_string());
    let shipped = manifests.args()?;
    ensure!(
        shipped == want,
        "deploy/shadow runs {shipped:?}, want Gardener's without leader election plus --shadow: {want:?}"
    );
    Ok(())
}

/// Ours in shadow mode: the shipped command line with our config, kubeconfig and ports.
struct Shadow {
    process: Binary,
    metrics_port: u16,
    log: PathBuf,
}

fn start_shadow(
    manifests: &ShadowManifests,
    dir: &Path,
    config: &Path,
    kubeconfig: &Path,
    pod: &str,
) -> Result<Shadow> {
    let ours = dwd_parity::locate_ours()?;
    let metrics_port = dwd_testenv::free_port()?;
    let health_port = dwd_testenv::free_port()?;
    let mut args: Vec<String> = manifests
        .args()?
        .into_iter()
        .map(|a| {
            if a.starts_with("--config-file=") {
                format!("--config-file={}", config.display())
            } else {
                a
            }
        })
        .collect();
    ensure!(
        args.iter().any(|a| a == "--shadow")
            && !args
                .iter()
                .any(|a| a.starts_with("--enable-leader-election")),
        "deploy/shadow runs without --shadow or with leader election: {args:?}"
    );
    args.extend([
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--metrics-bind-addr=127.0.0.1:{metrics_port}"),
        format!("--health-bind-addr=127.0.0.1:{health_port}"),
        format!("--shadow-window={WINDOW}"),
    ]);
    let log = dir.join("shadow.log");
    let process = Binary::spawn_with_env(
        &ours,
        &args,
        &[("POD_NAME", pod), ("POD_NAMESPACE", GARDEN)],
        &log,
    )?;
    Ok(Shadow {
        process,
        metrics_port,
        log,
    })
}

fn start_reference(
    scenario: &Scenario,
    dir: &Path,
    config: &Path,
    kubeconfig: &Path,
) -> Result<(Binary, PathBuf)> {
    let ports = [
        dwd_testenv::free_port()?,
        dwd_testenv::free_port()?,
        dwd_testenv::free_port()?,
    ];
    let args = command_line(scenario, config, kubeconfig, ports, GARDEN);
    let log = dir.join("reference.log");
    Ok((Binary::spawn(&reference()?, &args, &log)?, log))
}

fn scenario(name: &'static str, role: Role, world: WorldSpec) -> Scenario {
    Scenario {
        name,
        about: "shadow mode next to the reference",
        role,
        world,
        config_edits: Vec::new(),
        // Gardener starts the reference with --enable-leader-election=true.
        leader_election: true,
        actions: Vec::new(),
        duration: 0.0,
        expect: Vec::new(),
    }
}

/// Waits for a record of ours; prints and returns it.
async fn wait_record(
    shadow: &Shadow,
    secs: u64,
    key: &str,
    action: &str,
    verdict: &str,
) -> Result<Value> {
    let port = shadow.metrics_port;
    let record = until(
        secs,
        &format!("ours records {verdict} for {action} of {key}"),
        || async move {
            let all = records(port).await.map_err(|e| format!("{e:#}"))?;
            Ok(find_record(&all, key, action, verdict).cloned())
        },
    )
    .await?;
    eprintln!("record: {record}");
    Ok(record)
}

/// Every record of ours as `(key, action, verdict)`: nothing beyond what the test expects
/// (no spurious disagreement).
async fn verdicts(shadow: &Shadow) -> Result<Vec<(String, String, String)>> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    Ok(records(shadow.metrics_port)
        .await?
        .iter()
        .map(|r| (text(&r["key"]), text(&r["action"]), text(&r["verdict"])))
        .collect())
}

async fn metrics(shadow: &Shadow) -> Result<String> {
    let (status, body) = http_get(shadow.metrics_port, "/metrics").await?;
    ensure!(status == 200, "GET /metrics: {status}");
    Ok(body)
}

async fn replicas(seed: &SeedControlPlane, name: &str) -> Result<i32, String> {
    let d = seed.deployment(name).await.map_err(|e| e.to_string())?;
    Ok(d.spec.and_then(|s| s.replicas).unwrap_or(1))
}

async fn wait_replicas(seed: &SeedControlPlane, secs: u64, want: &[(&str, i32)]) -> Result<()> {
    until(secs, &format!("targets at {want:?}"), || async move {
        for (name, r) in want {
            if replicas(seed, name).await? != *r {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await
}

/// Least privilege: every cluster-wide permission shipped was used by `shadow_user` (but
/// `fallbacks`, which only a seed unlike ours needs).
fn check_every_permission_used(
    mine: &[&AuditEntry],
    manifests: &ShadowManifests,
    fallbacks: &[(&str, &str, &str)],
    shadow_user: &str,
) -> Result<()> {
    let unused: Vec<String> = manifests
        .cluster_permissions()?
        .into_iter()
        .filter(|(group, resource, verb)| {
            !fallbacks.contains(&(group.as_str(), resource.as_str(), verb.as_str()))
        })
        .filter(|(group, resource, verb)| {
            !mine
                .iter()
                .any(|e| &e.api_group == group && &e.resource == resource && &e.verb == verb)
        })
        .map(|(group, resource, verb)| format!("{verb} {group}/{resource}"))
        .collect();
    ensure!(
        unused.is_empty(),
        "shipped but never used by {shadow_user}: {}",
        unused.join(", ")
    );
    Ok(())
}

/// The audit checks common to both roles; `targets` selects the writes only the reference
/// may make (scaling a target, deleting a pod).
fn check_audit(
    entries: &[AuditEntry],
    manifests: &ShadowManifests,
    fallbacks: &[(&str, &str, &str)],
    targets: &dyn Fn(&AuditEntry) -> bool,
) -> Result<()> {
    let shadow_user = manifests.username()?;
    let shadow_user = shadow_user.as_str();
    let mine: Vec<&AuditEntry> = entries.iter().filter(|e| e.user == shadow_user).collect();
    check_every_permission_used(&mine, manifests, fallbacks, shadow_user)?;
    ensure!(
        mine.iter().any(|e| e.verb == "watch"),
        "the audit log has no watch of {shadow_user}: the check would not see it"
    );
    let allowed = |e: &AuditEntry| {
        e.resource == "events"
            && e.api_group.is_empty()
            && e.namespace == GARDEN
            && (e.verb == "create" || e.verb == "patch")
    };
    let forbidden: Vec<String> = mine
        .iter()
        .filter(|e| e.is_write() && !allowed(e))
        .map(|e| e.describe())
        .collect();
    ensure!(
        forbidden.is_empty(),
        "the shadow wrote:\n{}",
        forbidden.join("\n")
    );
    let events_written = mine.iter().filter(|e| allowed(e)).count();
    ensure!(
        events_written > 0,
        "no Event written by {shadow_user}: the check does not see its writes"
    );
    let refused: Vec<String> = mine
        .iter()
        .filter(|e| e.code == Some(403))
        .map(|e| e.describe())
        .collect();
    ensure!(
        refused.is_empty(),
        "requests of the shadow refused by the shipped RBAC:\n{}",
        refused.join("\n")
    );
    let leases: Vec<String> = mine
        .iter()
        .filter(|e| e.resource == "leases")
        .map(|e| e.describe())
        .collect();
    ensure!(
        leases.is_empty(),
        "the shadow touched Leases:\n{}",
        leases.join("\n")
    );
    let writers: BTreeSet<&str> = entries
        .iter()
        .filter(|e| targets(e))
        .map(|e| e.user.as_str())
        .collect();
    ensure!(
        writers == BTreeSet::from([REFERENCE_USER]),
        "targets written by {writers:?}, want only {REFERENCE_USER}"
    );
    let reads = mine.len() - events_written;
    eprintln!(
        "audit: {shadow_user}: {} requests, {reads} reads (get/list/watch/discovery; every shipped cluster-wide permission used but the fallbacks {fallbacks:?}), {events_written} Event writes in {GARDEN}, 0 other writes, 0 refused; target writes by {writers:?}",
        mine.len()
    );
    Ok(())
}

/// core/v1 Events about the shadow's own pod (reason, message), once every reason in `want`
/// is among them: the Events are posted in the background after the record they report, so
/// the test waits for them (at most 30 s) instead of reading once.
async fn own_events(
    admin: &kube::Client,
    pod: &str,
    want: &[&str],
) -> Result<Vec<(String, String)>> {
    let events: Api<Event> = Api::namespaced(admin.clone(), GARDEN);
    let fields = format!("involvedObject.name={pod}");
    let what = format!("Events {want:?} about {GARDEN}/{pod}");
    until(30, &what, || {
        let (events, fields) = (events.clone(), fields.clone());
        async move {
            let list = events
                .list(&ListParams::default().fields(&fields))
                .await
                .map_err(|e| e.to_string())?;
            let found: Vec<(String, String)> = list
                .items
                .into_iter()
                .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
                .collect();
            Ok(want
                .iter()
                .all(|reason| found.iter().any(|(r, _)| r == reason))
                .then_some(found))
        }
    })
    .await
}

/// The reference leads on Gardener's Lease; ours, without leader election, made none (its
/// shadow Lease, `<lease>-shadow`, does not exist either).
async fn check_leases(admin: &kube::Client, role: Role) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(admin.clone(), GARDEN);
    let name = lease_name(role);
    let holder = leases
        .get_opt(name)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    ensure!(!holder.is_empty(), "nobody holds {GARDEN}/{name}");
    let shadow_lease = format!("{name}-shadow");
    ensure!(
        leases.get_opt(&shadow_lease).await?.is_none(),
        "{GARDEN}/{shadow_lease} exists"
    );
    eprintln!("lease {GARDEN}/{name}: held by the reference ({holder}); no {shadow_lease}");
    Ok(())
}

// One story on one world that takes minutes to build: an outage both catch, then one only the
// reference acts on, then the audit log; split, each part would need the world and the logs of
// the one before.
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_prober_next_to_the_reference() -> Result<()> {
    let started = Instant::now();
    let reference_bin = reference()?;
    eprintln!("reference: {}", reference_bin.display());
    let env = env().await?;
    let dir = env.dir().join("shadow-prober");
    let lane = Lane::start_with(
        env,
        "shadow-prober",
        dir.clone(),
        ApiServerOptions {
            audit_log: true,
            ..ApiServerOptions::seed()
        },
    )
    .await?;
    let admin = lane.seed_direct.clone();

    // deploy/shadow as shipped: its config is Gardener's, its RBAC applied as is.
    let manifests = ShadowManifests::load(Role::Prober)?;
    ensure!(
        manifests.config()? == gardener_config(Role::Prober)?,
        "deploy/shadow/prober-config.yaml is not Gardener's prober config"
    );
    check_command_line(&manifests)?;
    apply_all(&manifests, &admin).await?;
    let shadow_kubeconfig = write(
        &dir,
        "shadow.kubeconfig",
        &service_account_kubeconfig(&lane.seed, &admin, &manifests.service_account()?).await?,
    )?;
    let reference_kubeconfig = write(
        &dir,
        "reference.kubeconfig",
        &lane
            .seed
            .kubeconfig_for(REFERENCE_USER, &["system:masters"])?,
    )?;
    let config = write(&dir, "dep-config.yaml", &shortened(Role::Prober)?)?;

    // 1. An outage both catch.
    let outage = scenario("shadow-outage", Role::Prober, WorldSpec::shoot(3));
    let world = lane.build(&outage).await?;
    let ns = world.namespace.clone();
    let (mut reference, reference_log) =
        start_reference(&outage, &dir, &config, &reference_kubeconfig)?;
    let pod = "dependency-watchdog-prober-shadow-5d8f7-x2x9q";
    let mut ours = start_shadow(&manifests, &dir, &config, &shadow_kubeconfig, pod)?;
    eprintln!("logs: {} {}", reference_log.display(), ours.log.display());
    let kubelets = world.sim.as_ref().context("no shoot")?.kubelets();
    let silenced = kubelets.silence_count(2);
    let outage_at = Instant::now();
    eprintln!("silenced {silenced:?}");
    wait_replicas(&world.seed, 60, &[(MCM, 0), (CA, 0), (KCM, 0)]).await?;
    eprintln!(
        "the reference scaled down {:.1}s after the silence",
        outage_at.elapsed().as_secs_f64()
    );
    let down = wait_record(&ours, 40, &ns, "scale_down", "agree").await?;
    ensure!(
        down["reference_lag_seconds"].is_number(),
        "no lag in {down}"
    );
    kubelets.resume_all();
    wait_replicas(&world.seed, 60, &[(KCM, 2), (MCM, 1), (CA, 1)]).await?;
    let up = wait_record(&ours, 40, &ns, "scale_up", "agree").await?;
    ensure!(up["reference_lag_seconds"].is_number(), "no lag in {up}");
    let text = metrics(&ours).await?;
    for action in ["scale_down", "scale_up"] {
        let agreed = dwd_testenv::metrics::sum(
            &text,
            "dwd_shadow_comparisons_total",
            &[
                ("component", "prober"),
                ("action", action),
                ("verdict", "agree"),
            ],
        );
        ensure!(
            agreed >= 1.0,
            "dwd_shadow_comparisons_total {action} agree = {agreed}"
        );
    }
    world.clean_up().await?;

    // 2. Only the reference acts: a Shoot nodeMonitorGracePeriod of 0s (README "Where we
    // differ"): the reference counts every lease as expired and scales the healthy shoot down;
    // ours ignores the value.
    let mut spec = WorldSpec::shoot(3);
    spec.shoot_state = Some(ShootState {
        node_monitor_grace_period: Some("0s".to_string()),
        ..ShootState::default()
    });
    let grace = scenario("shadow-grace", Role::Prober, spec);
    let world = lane.build(&grace).await?;
    let ns_grace = world.namespace.clone();
    wait_replicas(&world.seed, 60, &[(MCM, 0), (CA, 0), (KCM, 0)]).await?;
    let only = wait_record(&ours, 90, &ns_grace, "scale_down", "only_reference").await?;
    ensure!(
        only["our_latest_finding"]
            .as_str()
            .is_some_and(|f| !f.is_empty()),
        "no finding of ours in {only}"
    );

    let (_, shadow_text) = http_get(ours.metrics_port, "/shadow").await?;
    eprintln!("GET /shadow:\n{shadow_text}");
    let all = verdicts(&ours).await?;
    let want = [
        (ns.clone(), "scale_down", "agree"),
        (ns.clone(), "scale_up", "agree"),
        (ns_grace.clone(), "scale_down", "only_reference"),
    ]
    .map(|(k, a, v)| (k, a.to_string(), v.to_string()));
    ensure!(all == want, "records {all:?}, want {want:?}");
    let text = metrics(&ours).await?;
    eprintln!(
        "{}",
        text.lines()
            .filter(|l| l.starts_with("dwd_shadow_") && !l.contains("_bucket"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let events = own_events(
        &admin,
        pod,
        &["WouldScaleDown", "ShadowAgreement", "ShadowDisagreement"],
    )
    .await?;
    for (reason, message) in &events {
        eprintln!("event {reason}: {message}");
    }
    check_leases(&admin, Role::Prober).await?;
    ensure!(
        ours.process.stop(EXIT).await == Some(0),
        "ours did not exit 0"
    );
    reference.stop(EXIT).await;
    world.clean_up().await?;

    // 3. The audit log: ours wrote only its Events; the targets were scaled by the reference.
    let entries = flush_audit(&admin, &lane.seed.audit_log_path(), "audit-flush-prober").await?;
    let shoots = [ns.as_str(), ns_grace.as_str()];
    check_audit(&entries, &manifests, &[], &|e: &AuditEntry| {
        e.resource == "deployments"
            && (e.subresource.is_empty() || e.subresource == "scale")
            && (e.verb == "patch" || e.verb == "update")
            && shoots.contains(&e.namespace.as_str())
    })?;
    eprintln!(
        "shadow_prober_next_to_the_reference: {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

// One story on one world that takes minutes to build, its numbered steps in the order they
// happen; split, each step would need the pods, logs and windows the one before left.
#[allow(clippy::too_many_lines)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_weeder_next_to_the_reference() -> Result<()> {
    let started = Instant::now();
    let reference_bin = reference()?;
    eprintln!("reference: {}", reference_bin.display());
    let env = env().await?;
    let dir = env.dir().join("shadow-weeder");
    std::fs::create_dir_all(&dir)?;
    let seed = env
        .start_apiserver_with(
            "shadow-weeder-seed",
            ApiServerOptions {
                audit_log: true,
                ..ApiServerOptions::seed()
            },
        )
        .await?;
    let admin = seed.direct_client().await?;
    SeedControlPlane::new(admin.clone(), GARDEN)
        .create_namespace()
        .await?;

    let manifests = ShadowManifests::load(Role::Weeder)?;
    ensure!(
        manifests.config()? == gardener_config(Role::Weeder)?,
        "deploy/shadow/weeder-config.yaml is not Gardener's weeder config"
    );
    check_command_line(&manifests)?;
    apply_all(&manifests, &admin).await?;
    let shadow_user = manifests.username()?;
    let shadow_kubeconfig = write(
        &dir,
        "shadow.kubeconfig",
        &service_account_kubeconfig(&seed, &admin, &manifests.service_account()?).await?,
    )?;
    let reference_kubeconfig = write(
        &dir,
        "reference.kubeconfig",
        &seed.kubeconfig_for(REFERENCE_USER, &["system:masters"])?,
    )?;
    // Weeders watch for a minute, so both still watch when the dependant crash-loops.
    let config = ConfigEdit::Replace("watchDuration: 15s\n", "watchDuration: 1m0s\n")
        .apply(&shortened(Role::Weeder)?)?;
    let config = write(&dir, "dep-config.yaml", &config)?;

    // A control plane whose etcd is not ready yet; its kube-apiserver runs.
    let ns = "shoot--shadow--weeder";
    let plane = SeedControlPlane::new(admin.clone(), ns);
    plane.create_namespace().await?;
    plane
        .set_endpoint_slice("etcd-main-client", 1, EndpointsState::NotReady)
        .await?;
    let labels = [
        ("gardener.cloud/role", "controlplane"),
        ("role", "apiserver"),
    ];
    let victim = "kube-apiserver-0";
    plane.create_running_pod(victim, &labels).await?;

    let weeder = scenario("shadow-weeder", Role::Weeder, WorldSpec::seed_only());
    let (mut reference, reference_log) =
        start_reference(&weeder, &dir, &config, &reference_kubeconfig)?;
    let pod = "dependency-watchdog-weeder-shadow-6c9b4-p7k2m";
    let mut ours = start_shadow(&manifests, &dir, &config, &shadow_kubeconfig, pod)?;
    eprintln!("logs: {} {}", reference_log.display(), ours.log.display());

    // etcd comes back: both start a weeder; wait until both watch the dependants.
    plane
        .set_endpoint_slice("etcd-main-client", 1, EndpointsState::AllReady)
        .await?;
    let audit = seed.audit_log_path();
    let watchers = [REFERENCE_USER.to_string(), shadow_user.clone()];
    until(60, "both weeders watch the dependants", || {
        let (audit, watchers) = (audit.clone(), watchers.clone());
        async move {
            let entries = read_audit(&audit).map_err(|e| format!("{e:#}"))?;
            Ok(watchers
                .iter()
                .all(|user| {
                    entries.iter().any(|e| {
                        &e.user == user
                            && e.verb == "watch"
                            && e.resource == "pods"
                            && e.namespace == ns
                    })
                })
                .then_some(()))
        }
    })
    .await?;

    // The dependant crash-loops: the reference deletes it, ours would have.
    plane.set_crashlooping(victim, true).await?;
    let crashed_at = Instant::now();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    until(60, "the reference deletes the crash-looping pod", || {
        let pods = pods.clone();
        async move {
            let pod = pods.get_opt(victim).await.map_err(|e| e.to_string())?;
            Ok(pod.is_none().then_some(()))
        }
    })
    .await?;
    eprintln!(
        "the reference deleted {victim} {:.1}s after it crash-looped",
        crashed_at.elapsed().as_secs_f64()
    );
    let record = wait_record(&ours, 40, &format!("{ns}/{victim}"), "delete_pod", "agree").await?;
    ensure!(
        record["reference_lag_seconds"].is_number(),
        "no lag in {record}"
    );
    let text = metrics(&ours).await?;
    let agreed = dwd_testenv::metrics::sum(
        &text,
        "dwd_shadow_comparisons_total",
        &[
            ("component", "weeder"),
            ("action", "delete_pod"),
            ("verdict", "agree"),
        ],
    );
    ensure!(
        agreed >= 1.0,
        "dwd_shadow_comparisons_total delete_pod agree = {agreed}"
    );
    let (_, shadow_text) = http_get(ours.metrics_port, "/shadow").await?;
    eprintln!("GET /shadow:\n{shadow_text}");
    let all = verdicts(&ours).await?;
    ensure!(
        all.len() == 1 && all[0].1 == "delete_pod" && all[0].2 == "agree",
        "records {all:?}, want one agreement on the deletion"
    );
    let events = own_events(
        &admin,
        pod,
        &["WouldDeleteCrashLoopingPod", "ShadowAgreement"],
    )
    .await?;
    for (reason, message) in &events {
        eprintln!("event {reason}: {message}");
    }
    check_leases(&admin, Role::Weeder).await?;
    ensure!(
        ours.process.stop(EXIT).await == Some(0),
        "ours did not exit 0"
    );
    reference.stop(EXIT).await;

    let entries = flush_audit(&admin, &audit, "audit-flush-weeder").await?;
    // The pod watches start with a streaming list (one watch request); `list` is for seeds
    // that refuse streaming lists (weeder/pods.rs falls back to list + watch there).
    check_audit(
        &entries,
        &manifests,
        &[("", "pods", "list")],
        &|e: &AuditEntry| {
            e.resource == "pods"
                && e.subresource.is_empty()
                && (e.verb == "delete" || e.verb == "deletecollection")
                && e.namespace == ns
        },
    )?;
    eprintln!(
        "shadow_weeder_next_to_the_reference: {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
