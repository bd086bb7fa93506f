//! The shipped deployment manifests (`deploy/`) and their least-privilege RBAC, against a real
//! kube-apiserver.
//!
//! - The manifests are consistent: the Deployments run the binary with Gardener's command line,
//!   mount the ConfigMaps where that command line looks, the ConfigMaps are valid configs, the
//!   RBAC names what the configs name, the Grafana dashboard queries only metrics the binary
//!   exports (and all of them), and the prober's PrometheusRule has complete alerts (`for`,
//!   severity, summary, description) on metrics the binary exports.
//! - The real binary, authenticated as the shipped ServiceAccount with a token from the
//!   TokenRequest API and bound to exactly the shipped (Cluster)Roles, does its whole job:
//!   the prober scales a shoot down during an outage and back up, restores a target from its
//!   recorded replicas and writes its events (with UIDs, repetitions as series); the weeder
//!   deletes a crash-looping pod once its service's EndpointSlice is ready. Its log shows no
//!   `forbidden` and `dwd_events_total{outcome="Failed"}` stays absent.
//! - Every rule is needed: for each rule of the shipped ClusterRole and Role (iterated over the
//!   parsed YAML), the RBAC is applied without it; a SelfSubjectAccessReview per permission shows
//!   that the ServiceAccount lost exactly that rule's permissions and kept all others, and the
//!   binary, run again, fails in the way that rule predicts (a watch cache never syncs, a
//!   probe keeps failing, a scale fails, an event is written without the UID or not at all,
//!   the Lease can't be taken). A rule without such a check fails the test: a new rule must
//!   come with its reason. Each run waits for a *positive* sign of the failure (the forbidden
//!   call in the binary's log, a failure counter, an event lacking its UID) and then checks the
//!   consequence, so no check waits for "nothing happened".
//! - The ServiceAccounts can't do what is not granted (SelfSubjectAccessReviews), and API
//!   discovery, which the prober uses for its target kinds, is allowed by the default
//!   `system:discovery` binding, not by ours.
//!
//! Running the binary once per removed rule is cheap here (each run ends as soon as the failure
//! shows, 1–3 s), so every rule gets both the access-review check and the behavioural check.
//!
//! The prober and weeder tests share one seed apiserver (their ServiceAccounts, roles, Leases
//! and objects are disjoint: the prober watches Clusters, the weeder EndpointSlices of its
//! services) and run in parallel.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod harness;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, ensure};
use dependency_watchdog::observe::events::{
    REASON_POD_DELETED, REASON_SCALE_DOWN, REASON_SCALE_UP, REASON_SCALED_DOWN, REASON_SCALED_UP,
};
use dependency_watchdog::process::leader::{PROBER_LEASE, WEEDER_LEASE};
use dwd_core::scaling::{MELTDOWN_ANNOTATION, REPLICAS_ANNOTATION};
use dwd_sim::{EndpointsState, SeedControlPlane, SimShoot, SimShootOptions};
use dwd_testenv::{ApiServer, ApiServerOptions, TestEnv, eventually};
use harness::binary::{Watchdog, sample};
use harness::gardener::{apply, ensure_namespace};
use harness::monitoring::{
    RUNNING_PROBER_SERIES, brackets_balanced, check_dashboard, check_prometheus_rule,
    equality_matchers, exported_metrics_text, exported_sample_names, grafana_dashboard,
    prometheus_duration_ms, sample_names,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use kube::Api;
use kube::api::{DeleteParams, DynamicObject, ListParams, PostParams};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Namespace of the deployments, their ServiceAccounts and Leases.
const GARDEN: &str = "garden";
/// Deadline for anything that needs process start-up, cache sync or a few probe runs.
const DEADLINE: Duration = Duration::from_secs(45);

const KCM: &str = "kube-controller-manager";
const MCM: &str = "machine-controller-manager";
const CA: &str = "cluster-autoscaler";

/// Shoot whose kubelets go silent and come back: the scale-down/scale-up scenario.
const OUTAGE_NS: &str = "shoot--rbac--outage";
/// Healthy shoot whose KCM was scaled down (replicas recorded: 3) and whose MCM carries an
/// unusable replicas annotation: every run restores KCM and fails on MCM, which exercises the
/// failure paths (ScaleUpFailed warnings with the target's UID, repeated events as series).
const RESTORE_NS: &str = "shoot--rbac--restore";
/// Namespace of the weeder scenario.
const WEEDER_NS: &str = "shoot--rbac--weeder";
/// The crash-looping dependant of etcd-main-client in the weeder scenario.
const WEEDER_POD: &str = "kube-apiserver-0";
const ETCD_SERVICE: &str = "etcd-main-client";

/// Gardener's command lines (gardener/gardener, pkg/component/nodemanagement/dependencywatchdog).
const GARDENER_PROBER_COMMAND: &[&str] = &[
    "/usr/local/bin/dependency-watchdog",
    "prober",
    "--config-file=/etc/dependency-watchdog/config/dep-config.yaml",
    "--kube-api-qps=20.0",
    "--kube-api-burst=100",
    "--zap-log-level=INFO",
    "--enable-leader-election=true",
];
const GARDENER_WEEDER_COMMAND: &[&str] = &[
    "/usr/local/bin/dependency-watchdog",
    "weeder",
    "--config-file=/etc/dependency-watchdog/config/dep-config.yaml",
    "--enable-leader-election=true",
];

// --- the shipped manifests ------------------------------------------------------------------

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// The YAML documents of one file (multi-document files split at `---`).
fn documents(path: &Path) -> Result<Vec<Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .map_err(|e| anyhow!("parsing {}: {e}", path.display()))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// One component's manifests (`deploy/prober` or `deploy/weeder`), typed.
#[derive(Clone)]
struct Component {
    /// `prober` or `weeder`.
    name: &'static str,
    service_account: ServiceAccount,
    cluster_role: ClusterRole,
    cluster_role_binding: ClusterRoleBinding,
    role: Role,
    role_binding: RoleBinding,
    deployment: Deployment,
    config_map: ConfigMap,
    service: Service,
    service_monitor: Value,
    /// The alerts (`prometheusrule.yaml`), if the component ships any.
    prometheus_rule: Option<Value>,
}

impl Component {
    fn load(name: &'static str) -> Result<Component> {
        let dir = deploy_dir().join(name);
        let mut by_kind: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .with_context(|| format!("listing {}", dir.display()))?
            .map(|e| e.map(|e| e.path()))
            .collect::<std::io::Result<_>>()?;
        files.sort();
        for file in files
            .iter()
            .filter(|f| f.extension() == Some("yaml".as_ref()))
        {
            for doc in documents(file)? {
                let kind = doc["kind"]
                    .as_str()
                    .with_context(|| format!("a document without kind in {}", file.display()))?
                    .to_string();
                by_kind.entry(kind).or_default().push(doc);
            }
        }
        let prometheus_rule = match by_kind.remove("PrometheusRule") {
            None => None,
            Some(mut docs) => {
                ensure!(
                    docs.len() == 1,
                    "deploy/{name}: {} PrometheusRules, want at most 1",
                    docs.len()
                );
                Some(docs.remove(0))
            }
        };
        let mut one = |kind: &str| -> Result<Value> {
            let mut docs = by_kind.remove(kind).unwrap_or_default();
            ensure!(
                docs.len() == 1,
                "deploy/{name}: {} {kind}s, want 1",
                docs.len()
            );
            Ok(docs.remove(0))
        };
        fn typed<T: DeserializeOwned>(v: Value, kind: &str) -> Result<T> {
            serde_json::from_value(v).with_context(|| format!("{kind} is not a valid {kind}"))
        }
        let component = Component {
            name,
            service_account: typed(one("ServiceAccount")?, "ServiceAccount")?,
            cluster_role: typed(one("ClusterRole")?, "ClusterRole")?,
            cluster_role_binding: typed(one("ClusterRoleBinding")?, "ClusterRoleBinding")?,
            role: typed(one("Role")?, "Role")?,
            role_binding: typed(one("RoleBinding")?, "RoleBinding")?,
            deployment: typed(one("Deployment")?, "Deployment")?,
            config_map: typed(one("ConfigMap")?, "ConfigMap")?,
            service: typed(one("Service")?, "Service")?,
            service_monitor: one("ServiceMonitor")?,
            prometheus_rule,
        };
        // A PodDisruptionBudget is the only other kind.
        by_kind.remove("PodDisruptionBudget");
        ensure!(
            by_kind.is_empty(),
            "deploy/{name}: unexpected kinds {:?}",
            by_kind.keys()
        );
        Ok(component)
    }

    fn sa_name(&self) -> String {
        self.service_account
            .metadata
            .name
            .clone()
            .unwrap_or_default()
    }

    /// `system:serviceaccount:garden:<name>`.
    fn username(&self) -> String {
        format!("system:serviceaccount:{GARDEN}:{}", self.sa_name())
    }

    fn container(&self) -> Result<&k8s_openapi::api::core::v1::Container> {
        self.deployment
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .and_then(|s| s.containers.first())
            .context("the Deployment has no container")
    }

    /// The container's command line without the binary path: what the binary is started with.
    fn shipped_args(&self) -> Result<Vec<String>> {
        let command = self.container()?.command.clone().unwrap_or_default();
        ensure!(command.len() > 1, "no command line in the Deployment");
        Ok(command[1..].to_vec())
    }

    /// `dep-config.yaml` of the ConfigMap.
    fn config(&self) -> Result<String> {
        self.config_map
            .data
            .as_ref()
            .and_then(|d| d.get("dep-config.yaml"))
            .cloned()
            .context("the ConfigMap has no dep-config.yaml")
    }

    fn lease(&self) -> &'static str {
        if self.name == "prober" {
            PROBER_LEASE
        } else {
            WEEDER_LEASE
        }
    }

    /// The same manifests without rule `index` of the ClusterRole or the Role.
    fn without(&self, rule: RuleId) -> Component {
        let mut reduced = self.clone();
        match rule {
            RuleId::Cluster(i) => {
                if let Some(rules) = reduced.cluster_role.rules.as_mut() {
                    rules.remove(i);
                }
            }
            RuleId::Namespaced(i) => {
                if let Some(rules) = reduced.role.rules.as_mut() {
                    rules.remove(i);
                }
            }
        }
        reduced
    }

    /// Every rule: (id, rule).
    fn rules(&self) -> Vec<(RuleId, PolicyRule)> {
        let cluster = self.cluster_role.rules.clone().unwrap_or_default();
        let namespaced = self.role.rules.clone().unwrap_or_default();
        cluster
            .into_iter()
            .enumerate()
            .map(|(i, r)| (RuleId::Cluster(i), r))
            .chain(
                namespaced
                    .into_iter()
                    .enumerate()
                    .map(|(i, r)| (RuleId::Namespaced(i), r)),
            )
            .collect()
    }
}

/// A rule of the ClusterRole or of the Role, by index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RuleId {
    Cluster(usize),
    Namespaced(usize),
}

/// `group/resource:verbs[names]`, e.g. `apps/deployments/scale:patch`.
fn describe_rule(rule: &PolicyRule) -> String {
    let groups = rule.api_groups.clone().unwrap_or_default().join(",");
    let resources = rule.resources.clone().unwrap_or_default().join(",");
    let names = rule
        .resource_names
        .as_ref()
        .map(|n| format!("[{}]", n.join(",")))
        .unwrap_or_default();
    format!("{groups}/{resources}:{}{names}", rule.verbs.join(","))
}

/// The rule's key for choosing its behavioural check: `group/resource:verbs` (no names).
fn rule_key(rule: &PolicyRule) -> String {
    let groups = rule.api_groups.clone().unwrap_or_default().join(",");
    let resources = rule.resources.clone().unwrap_or_default().join(",");
    format!("{groups}/{resources}:{}", rule.verbs.join(","))
}

// --- permissions and access reviews ---------------------------------------------------------

/// One permission, as a SelfSubjectAccessReview asks for it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Perm {
    group: String,
    resource: String,
    subresource: Option<String>,
    verb: String,
    namespace: Option<String>,
    name: Option<String>,
}

impl Perm {
    fn new(group: &str, resource: &str, verb: &str, namespace: Option<&str>) -> Perm {
        let (resource, subresource) = match resource.split_once('/') {
            Some((r, s)) => (r.to_string(), Some(s.to_string())),
            None => (resource.to_string(), None),
        };
        Perm {
            group: group.into(),
            resource,
            subresource,
            verb: verb.into(),
            namespace: namespace.map(str::to_string),
            name: None,
        }
    }

    fn named(mut self, name: &str) -> Perm {
        self.name = Some(name.into());
        self
    }
}

impl std::fmt::Display for Perm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ", self.verb)?;
        if !self.group.is_empty() {
            write!(f, "{}/", self.group)?;
        }
        write!(f, "{}", self.resource)?;
        if let Some(s) = &self.subresource {
            write!(f, "/{s}")?;
        }
        if let Some(n) = &self.name {
            write!(f, " {n}")?;
        }
        match &self.namespace {
            Some(ns) => write!(f, " in {ns}"),
            None => write!(f, " (all namespaces)"),
        }
    }
}

/// The permissions a rule grants, as the code uses them: list and watch across all
/// namespaces (the code's watches are cluster-wide), other verbs in `sample_ns` (for a Role:
/// its namespace); the cluster-scoped `clusters` without namespace.
fn perms_of(rule: &PolicyRule, role_namespace: Option<&str>, sample_ns: &str) -> Vec<Perm> {
    let mut perms = Vec::new();
    let names: Vec<Option<String>> = match &rule.resource_names {
        Some(names) if !names.is_empty() => names.iter().cloned().map(Some).collect(),
        _ => vec![None],
    };
    for group in rule.api_groups.clone().unwrap_or_default() {
        for resource in rule.resources.clone().unwrap_or_default() {
            for verb in &rule.verbs {
                let namespace = match role_namespace {
                    Some(ns) => Some(ns),
                    None if resource == "clusters" => None,
                    None if verb == "list" || verb == "watch" => None,
                    None => Some(sample_ns),
                };
                for name in &names {
                    let perm = Perm::new(&group, &resource, verb, namespace);
                    perms.push(match name {
                        Some(n) => perm.named(n),
                        None => perm,
                    });
                }
            }
        }
    }
    perms
}

/// Every permission of a component's RBAC, by rule.
fn all_perms(c: &Component, sample_ns: &str) -> Vec<(RuleId, Perm)> {
    c.rules()
        .into_iter()
        .flat_map(|(id, rule)| {
            let ns = match id {
                RuleId::Cluster(_) => None,
                RuleId::Namespaced(_) => Some(GARDEN),
            };
            perms_of(&rule, ns, sample_ns)
                .into_iter()
                .map(move |p| (id, p))
        })
        .collect()
}

/// Whether the client's user may do `perm` (SelfSubjectAccessReview), and the reason given.
async fn can(client: &kube::Client, perm: &Perm) -> Result<(bool, String)> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(perm.group.clone()),
                resource: Some(perm.resource.clone()),
                subresource: perm.subresource.clone(),
                verb: Some(perm.verb.clone()),
                namespace: perm.namespace.clone(),
                name: perm.name.clone(),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .with_context(|| format!("access review of {perm}"))?;
    let status = answer.status.unwrap_or_default();
    Ok((status.allowed, status.reason.unwrap_or_default()))
}

/// Whether the client's user may GET the non-resource `path`, and the reason given.
async fn can_get_path(client: &kube::Client, path: &str) -> Result<(bool, String)> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(path.into()),
                verb: Some("get".into()),
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .with_context(|| format!("access review of GET {path}"))?;
    let status = answer.status.unwrap_or_default();
    Ok((status.allowed, status.reason.unwrap_or_default()))
}

/// Waits until the ServiceAccount behind `client` may do exactly `expect` (RBAC changes reach
/// the authorizer through its informers, a few milliseconds after the write).
async fn wait_access(client: &kube::Client, expect: &[(Perm, bool)]) -> Result<()> {
    eventually(DEADLINE, "RBAC in effect", || async {
        let answers = futures::future::join_all(expect.iter().map(|(p, _)| can(client, p))).await;
        let mut wrong = Vec::new();
        for ((perm, want), answer) in expect.iter().zip(answers) {
            let (allowed, _) = answer.map_err(|e| format!("{e:#}"))?;
            if allowed != *want {
                wrong.push(format!("{perm}: allowed={allowed}, want {want}"));
            }
        }
        if wrong.is_empty() {
            Ok(Some(()))
        } else {
            Err(wrong.join("; "))
        }
    })
    .await
    .map_err(|e| anyhow!(e))
}

// --- applying the manifests -----------------------------------------------------------------

/// Applies the component's ServiceAccount, (Cluster)Roles and bindings.
async fn apply_rbac(admin: &kube::Client, c: &Component) -> Result<()> {
    apply(
        &Api::namespaced(admin.clone(), GARDEN),
        &c.service_account.clone(),
    )
    .await?;
    apply(&Api::all(admin.clone()), &c.cluster_role).await?;
    apply(&Api::all(admin.clone()), &c.cluster_role_binding).await?;
    apply(&Api::namespaced(admin.clone(), GARDEN), &c.role).await?;
    apply(&Api::namespaced(admin.clone(), GARDEN), &c.role_binding).await?;
    Ok(())
}

async fn delete_lease(admin: &kube::Client, name: &str) -> Result<()> {
    match Api::<Lease>::namespaced(admin.clone(), GARDEN)
        .delete(name, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Who holds `garden/<name>`, if anyone.
async fn lease_holder(admin: &kube::Client, name: &str) -> Result<Option<String>> {
    harness::in_process::lease_holder(admin, GARDEN, name).await
}

/// A component set up on the seed: RBAC applied, a token, a kubeconfig and a client with it.
struct Identity {
    kubeconfig: PathBuf,
    client: kube::Client,
}

async fn identity(seed: &ApiServer, admin: &kube::Client, c: &Component) -> Result<Identity> {
    apply_rbac(admin, c).await?;
    let kubeconfig_text =
        dwd_testenv::service_account::kubeconfig(seed, admin, GARDEN, &c.sa_name()).await?;
    let kubeconfig = work_dir().await?.join(format!("{}.kubeconfig", c.name));
    std::fs::write(&kubeconfig, &kubeconfig_text)?;
    let client = dwd_testenv::client_from_kubeconfig(c.name, &kubeconfig_text).await?;
    // The token authenticates as the ServiceAccount (and nothing more).
    let review: SelfSubjectReview = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .context("SelfSubjectReview")?;
    let user = review.status.and_then(|s| s.user_info).unwrap_or_default();
    ensure!(
        user.username.as_deref() == Some(c.username().as_str()),
        "authenticated as {user:?}"
    );
    Ok(Identity { kubeconfig, client })
}

// --- the test environment -------------------------------------------------------------------

async fn env() -> Result<&'static TestEnv> {
    static ENV: tokio::sync::OnceCell<TestEnv> = tokio::sync::OnceCell::const_new();
    Ok(ENV.get_or_try_init(TestEnv::start).await?)
}

/// The seed apiserver of this test binary (CRDs installed, namespace garden).
async fn seed() -> Result<&'static ApiServer> {
    static SEED: tokio::sync::OnceCell<ApiServer> = tokio::sync::OnceCell::const_new();
    SEED.get_or_try_init(|| async {
        let seed = env()
            .await?
            .start_apiserver_with("rbac-seed", ApiServerOptions::seed())
            .await?;
        ensure_namespace(&seed.client().await?, GARDEN).await?;
        Ok::<_, anyhow::Error>(seed)
    })
    .await
}

/// A directory for configs, kubeconfigs and logs, inside the environment's (removed with it).
async fn work_dir() -> Result<PathBuf> {
    let dir = env().await?.dir().join("rbac-test");
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

// --- the binary -----------------------------------------------------------------------------

/// Leader-election timings of the runs. Every run starts without a Lease (the previous run's
/// is deleted), so it leads at its first attempt whatever the lease duration; a generous renew
/// deadline keeps a CPU-starved test machine from costing a run its leadership, a short retry
/// period makes denied attempts repeat quickly.
const LEADER_FLAGS: &[&str] = &[
    "--leader-elect-lease-duration=10s",
    "--leader-elect-renew-deadline=8s",
    "--leader-elect-retry-period=500ms",
];

/// Starts `c`'s real binary as run `run` (also its POD_NAME, so its events name it): the
/// shipped command line with `--config-file` pointing at `config`, plus what a test must add —
/// the ServiceAccount's kubeconfig (in a pod: in-cluster config), loopback ports, short
/// leader-election timings. The shipped `--zap-log-level` decides, as in the pod.
fn start_watchdog(
    c: &Component,
    run: &str,
    dir: &Path,
    config: &Path,
    kubeconfig: &Path,
) -> Result<Watchdog> {
    let metrics_port = dwd_testenv::free_port()?;
    let health_port = dwd_testenv::free_port()?;
    let mut args: Vec<String> = c
        .shipped_args()?
        .into_iter()
        .map(|arg| {
            if arg.starts_with("--config-file=") {
                format!("--config-file={}", config.display())
            } else {
                arg
            }
        })
        .collect();
    args.push(format!("--kubeconfig={}", kubeconfig.display()));
    args.push(format!("--metrics-bind-addr=127.0.0.1:{metrics_port}"));
    args.push(format!("--health-bind-addr=127.0.0.1:{health_port}"));
    args.extend(LEADER_FLAGS.iter().map(|f| (*f).to_string()));
    Watchdog::spawn(run, &args, &[("POD_NAME", run)], dir, metrics_port)
}

// --- reading the seed -----------------------------------------------------------------------

async fn deployment(admin: &kube::Client, ns: &str, name: &str) -> Result<Deployment> {
    Ok(Api::<Deployment>::namespaced(admin.clone(), ns)
        .get(name)
        .await?)
}

fn replicas_and_annotations(d: &Deployment) -> (i32, BTreeMap<String, String>) {
    (
        d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
        d.metadata.annotations.clone().unwrap_or_default(),
    )
}

/// Waits until every named Deployment has `replicas` and no watchdog annotation is left when
/// `clean` (after a scale-up).
async fn wait_replicas(
    admin: &kube::Client,
    ns: &str,
    want: &[(&str, i32)],
    clean: bool,
) -> Result<()> {
    let what = format!(
        "{ns}: replicas {want:?}{}",
        if clean { ", annotations removed" } else { "" }
    );
    eventually(DEADLINE, &what, || async {
        let mut seen = Vec::new();
        let mut done = true;
        for (name, n) in want {
            let d = deployment(admin, ns, name)
                .await
                .map_err(|e| e.to_string())?;
            let (replicas, annotations) = replicas_and_annotations(&d);
            let left = annotations.contains_key(REPLICAS_ANNOTATION)
                || annotations.contains_key(MELTDOWN_ANNOTATION);
            done &= replicas == *n && !(clean && left);
            seen.push(format!("{name}={replicas} {annotations:?}"));
        }
        if done {
            Ok(Some(()))
        } else {
            Err(format!("seen {seen:?}"))
        }
    })
    .await
    .map_err(|e| anyhow!(e))
}

/// Events written by run `run` (its reportingInstance) in `namespace` about `kind`/`name`.
async fn events_of(
    admin: &kube::Client,
    run: &str,
    namespace: &str,
    kind: &str,
    name: &str,
    reason: &str,
) -> Result<Vec<Event>> {
    Ok(Api::<Event>::namespaced(admin.clone(), namespace)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.reporting_instance.as_deref() == Some(run)
                && e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name)
                })
        })
        .collect())
}

/// Waits until run `run` wrote at least one such event; returns them.
async fn wait_events(
    admin: &kube::Client,
    run: &str,
    namespace: &str,
    kind: &str,
    name: &str,
    reason: &str,
) -> Result<Vec<Event>> {
    let what = format!("{reason} event on {kind} {namespace}/{name} by {run}");
    eventually(DEADLINE, &what, || async {
        let found = events_of(admin, run, namespace, kind, name, reason)
            .await
            .map_err(|e| e.to_string())?;
        Ok((!found.is_empty()).then_some(found))
    })
    .await
    .map_err(|e| anyhow!(e))
}

fn uids(events: &[Event]) -> BTreeSet<Option<String>> {
    events
        .iter()
        .map(|e| e.regarding.as_ref().and_then(|r| r.uid.clone()))
        .collect()
}

// --- 1. the manifests -----------------------------------------------------------------------

#[test]
fn prometheus_expression_helpers() {
    assert!(brackets_balanced(
        r#"max by (a) (x{l="(", m=~"[a-z]+"} == 1) and on (a) sum(rate(y[5m])) > 0"#
    ));
    assert!(!brackets_balanced("max by (a (x)"));
    assert!(!brackets_balanced("rate(x[5m)]"));
    assert_eq!(prometheus_duration_ms("90s"), Some(90_000));
    assert_eq!(prometheus_duration_ms("1m30s"), Some(90_000));
    assert_eq!(prometheus_duration_ms("1h"), Some(3_600_000));
    assert_eq!(prometheus_duration_ms("500ms"), Some(500));
    assert_eq!(prometheus_duration_ms("1m500ms"), Some(60_500));
    assert_eq!(prometheus_duration_ms("30s1m"), None);
    assert_eq!(prometheus_duration_ms("1.5m"), None);
    assert_eq!(prometheus_duration_ms("5"), None);
    assert_eq!(prometheus_duration_ms(""), None);
    assert_eq!(
        equality_matchers(
            r#"sum(dwd_a{job=~"$job", level="pending", cause!="x"}) + dwd_b{shoot="$shoot", c = "d"}"#
        ),
        vec![
            ("dwd_a".into(), "level".into(), "pending".into()),
            ("dwd_b".into(), "c".into(), "d".into()),
        ]
    );
}

/// The bindings give the shipped roles to the shipped ServiceAccount `sa`; the rules hold no
/// wildcard, no non-resource URL and no RBAC or identity verb, and one names the Lease the
/// binary uses.
fn check_rbac(name: &str, c: &Component, sa: &str) -> Result<()> {
    // Bindings: the shipped roles, to the shipped ServiceAccount.
    let subject_ok = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        matches!(subjects.as_deref(), Some([s]) if s.kind == "ServiceAccount"
            && s.name == sa && s.namespace.as_deref() == Some(GARDEN))
    };
    ensure!(
        subject_ok(&c.cluster_role_binding.subjects),
        "{name}: ClusterRoleBinding subject"
    );
    ensure!(
        subject_ok(&c.role_binding.subjects),
        "{name}: RoleBinding subject"
    );
    ensure!(
        c.cluster_role_binding.role_ref.kind == "ClusterRole"
            && Some(&c.cluster_role_binding.role_ref.name) == c.cluster_role.metadata.name.as_ref()
    );
    ensure!(
        c.role_binding.role_ref.kind == "Role"
            && Some(&c.role_binding.role_ref.name) == c.role.metadata.name.as_ref()
    );
    ensure!(c.role.metadata.namespace.as_deref() == Some(GARDEN));
    ensure!(c.role_binding.metadata.namespace.as_deref() == Some(GARDEN));

    // Least privilege by construction: no wildcards, no non-resource URLs, no RBAC or
    // identity verbs.
    for (_, rule) in c.rules() {
        let d = describe_rule(&rule);
        let all = rule
            .api_groups
            .iter()
            .flatten()
            .chain(rule.resources.iter().flatten())
            .chain(rule.resource_names.iter().flatten())
            .chain(rule.verbs.iter());
        for word in all {
            ensure!(!word.contains('*'), "{name}: wildcard in {d}");
        }
        ensure!(
            rule.non_resource_urls.is_none(),
            "{name}: non-resource URLs in {d}"
        );
        for verb in &rule.verbs {
            ensure!(
                !["escalate", "bind", "impersonate", "deletecollection"].contains(&verb.as_str()),
                "{name}: verb {verb} in {d}"
            );
        }
    }
    // The Lease rule names the Lease the binary uses.
    ensure!(
        c.role
            .rules
            .iter()
            .flatten()
            .any(|r| r.resource_names.as_deref() == Some(&[c.lease().to_string()][..])),
        "{name}: no rule names Lease {}",
        c.lease()
    );
    Ok(())
}

/// The Deployment runs Gardener's `command` as ServiceAccount `sa`, with its ports, probes,
/// POD_NAME, two replicas, hardened.
fn check_deployment(name: &str, c: &Component, command: &[&str], sa: &str) -> Result<()> {
    // The Deployment: Gardener's command line, the config where it looks, ports, probes,
    // POD_NAME, two replicas, hardened.
    let d = &c.deployment;
    ensure!(d.metadata.namespace.as_deref() == Some(GARDEN));
    let spec = d.spec.as_ref().context("Deployment spec")?;
    ensure!(spec.replicas == Some(2), "{name}: replicas");
    let pod = spec.template.spec.as_ref().context("pod spec")?;
    ensure!(pod.service_account_name.as_deref() == Some(sa));
    let container = c.container()?;
    let want: Vec<String> = command.iter().map(|s| s.to_string()).collect();
    ensure!(
        container.command.as_ref() == Some(&want),
        "{name}: command {:?}, Gardener passes {want:?}",
        container.command
    );
    ensure!(container.args.is_none(), "{name}: args besides the command");
    ensure!(container.image.as_deref() == Some("dependency-watchdog:latest"));
    let ports: BTreeMap<String, i32> = container
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone().unwrap_or_default(), p.container_port))
        .collect();
    ensure!(
        ports == BTreeMap::from([("metrics".into(), 9643), ("health".into(), 9644)]),
        "{name}: ports {ports:?}"
    );
    let probe_path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        p.as_ref()
            .and_then(|p| p.http_get.as_ref())
            .map(|h| (h.path.clone().unwrap_or_default(), format!("{:?}", h.port)))
    };
    ensure!(
        probe_path(&container.liveness_probe)
            == Some(("/healthz".into(), "String(\"health\")".into())),
        "{name}: liveness {:?}",
        probe_path(&container.liveness_probe)
    );
    ensure!(
        probe_path(&container.readiness_probe)
            == Some(("/readyz".into(), "String(\"health\")".into())),
        "{name}: readiness {:?}",
        probe_path(&container.readiness_probe)
    );
    let pod_name = container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "POD_NAME")
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.clone());
    ensure!(
        pod_name.as_deref() == Some("metadata.name"),
        "{name}: POD_NAME"
    );
    let resources = container.resources.as_ref().context("resources")?;
    ensure!(
        resources.requests.is_some() && resources.limits.is_some(),
        "{name}: resources"
    );
    let sc = container
        .security_context
        .as_ref()
        .context("securityContext")?;
    ensure!(
        sc.read_only_root_filesystem == Some(true),
        "{name}: read-only root"
    );
    ensure!(
        sc.allow_privilege_escalation == Some(false),
        "{name}: privilege escalation"
    );
    let psc = pod
        .security_context
        .as_ref()
        .context("pod securityContext")?;
    ensure!(psc.run_as_non_root == Some(true), "{name}: non-root");
    Ok(())
}

/// The ConfigMap is mounted where `command`'s --config-file points.
fn check_config_mount(name: &str, c: &Component, command: &[&str]) -> Result<()> {
    let spec = c.deployment.spec.as_ref().context("Deployment spec")?;
    let pod = spec.template.spec.as_ref().context("pod spec")?;
    let container = c.container()?;
    let want: Vec<String> = command.iter().map(|s| s.to_string()).collect();
    // The ConfigMap is mounted where --config-file points, and the config is valid.
    let mount = container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "config")
        .context("config mount")?;
    ensure!(
        want.contains(&format!(
            "--config-file={}/dep-config.yaml",
            mount.mount_path
        )),
        "{name}: --config-file is not in the mount {}",
        mount.mount_path
    );
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "config")
        .and_then(|v| v.config_map.as_ref())
        .context("config volume")?;
    ensure!(Some(&volume.name) == c.config_map.metadata.name.as_ref());
    Ok(())
}

/// The ConfigMap's config loads without warnings and is the seeds' (the prober's targets and
/// their levels, with the RBAC's resourceNames its names; the weeder's two services).
fn check_config(name: &str, c: &Component) -> Result<()> {
    let config = c.config()?;
    if name == "prober" {
        let loaded = dwd_core::ProberConfig::from_yaml(&config)
            .map_err(|e| anyhow!("prober ConfigMap: {e}"))?;
        ensure!(
            loaded.warnings.is_empty(),
            "warnings: {:?}",
            loaded.warnings
        );
        let cfg = loaded.config;
        let targets: Vec<(String, u32, u32)> = cfg
            .dependent_resource_infos
            .iter()
            .map(|i| (i.target.name.clone(), i.scale_up.level, i.scale_down.level))
            .collect();
        ensure!(
            targets == [(KCM.into(), 1, 0), (MCM.into(), 1, 1), (CA.into(), 0, 2)],
            "the seeds' levels: {targets:?}"
        );
        // The RBAC's resourceNames are the config's names.
        let names_of = |resource: &str| -> BTreeSet<Vec<String>> {
            c.cluster_role
                .rules
                .iter()
                .flatten()
                .filter(|r| r.resources.iter().flatten().any(|x| x == resource))
                .map(|r| r.resource_names.clone().unwrap_or_default())
                .collect()
        };
        ensure!(
            names_of("secrets") == BTreeSet::from([vec![cfg.kube_config_secret_name.clone()]]),
            "secret names {:?}",
            names_of("secrets")
        );
        let target_names: Vec<String> = targets.iter().map(|(n, _, _)| n.clone()).collect();
        ensure!(
            names_of("deployments") == BTreeSet::from([target_names.clone()]),
            "deployments names {:?}",
            names_of("deployments")
        );
    } else {
        let loaded = dwd_core::WeederConfig::from_yaml(&config)
            .map_err(|e| anyhow!("weeder ConfigMap: {e}"))?;
        ensure!(
            loaded.warnings.is_empty(),
            "warnings: {:?}",
            loaded.warnings
        );
        let services: Vec<&String> = loaded
            .config
            .services_and_dependant_selectors
            .keys()
            .collect();
        ensure!(
            services == ["etcd-main-client", "kube-apiserver"],
            "{services:?}"
        );
    }
    Ok(())
}

/// Service and ServiceMonitor reach the metrics port of the Deployment's pods.
fn check_service_and_monitor(name: &str, c: &Component) -> Result<()> {
    let spec = c.deployment.spec.as_ref().context("Deployment spec")?;
    // Service and ServiceMonitor reach the metrics port of these pods.
    let pod_labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let svc = c.service.spec.as_ref().context("Service spec")?;
    let selector = svc.selector.clone().unwrap_or_default();
    ensure!(
        !selector.is_empty() && selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
        "{name}: Service selector {selector:?} vs pod labels {pod_labels:?}"
    );
    let port = svc
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("metrics"));
    ensure!(
        port.is_some_and(|p| p.port == 9643
            && p.target_port
                == Some(
                    k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(
                        "metrics".into()
                    )
                )),
        "{name}: Service port {port:?}"
    );
    let sm = &c.service_monitor;
    ensure!(sm["apiVersion"] == "monitoring.coreos.com/v1");
    let service_labels = c.service.metadata.labels.clone().unwrap_or_default();
    let sm_selector = sm["spec"]["selector"]["matchLabels"]
        .as_object()
        .context("ServiceMonitor selector")?;
    ensure!(
        sm_selector
            .iter()
            .all(|(k, v)| service_labels.get(k).map(String::as_str) == v.as_str()),
        "{name}: ServiceMonitor selects {sm_selector:?}, Service has {service_labels:?}"
    );
    ensure!(sm["spec"]["endpoints"][0]["port"] == "metrics");
    ensure!(sm["spec"]["namespaceSelector"]["matchNames"][0] == GARDEN);
    Ok(())
}

#[test]
fn shipped_manifests_are_consistent_and_run_the_binary_as_gardener_does() -> Result<()> {
    let exported_text = exported_metrics_text();
    let exported = exported_sample_names();
    for (name, command) in [
        ("prober", GARDENER_PROBER_COMMAND),
        ("weeder", GARDENER_WEEDER_COMMAND),
    ] {
        let c = Component::load(name)?;
        let app = format!("dependency-watchdog-{name}");
        let sa = c.sa_name();
        ensure!(sa == app, "{name}: ServiceAccount {sa}");
        ensure!(c.service_account.metadata.namespace.as_deref() == Some(GARDEN));

        check_rbac(name, &c, &sa)?;
        check_deployment(name, &c, command, &sa)?;
        check_config_mount(name, &c, command)?;
        check_config(name, &c)?;
        check_service_and_monitor(name, &c)?;

        // The prober's alerts (issue 34: one fires when shoots with a decision pending wait
        // for room), complete and on exported metrics; the weeder ships none.
        match (name, &c.prometheus_rule) {
            ("prober", Some(rule)) => {
                let alerts = check_prometheus_rule(
                    name,
                    rule,
                    &c.service_monitor,
                    &exported,
                    &exported_text,
                )?;
                ensure!(
                    alerts.contains("DependencyWatchdogProtectionWaitsForRoom"),
                    "prober: no alert on protection waiting for room: {alerts:?}"
                );
            }
            ("prober", None) => anyhow::bail!("deploy/prober: no PrometheusRule"),
            (_, Some(_)) => anyhow::bail!("deploy/{name}: an unexpected PrometheusRule"),
            (_, None) => {}
        }
    }

    check_dashboard(
        "deploy/grafana",
        &grafana_dashboard()?,
        &exported,
        &exported_text,
    )
}

// --- 2. the prober --------------------------------------------------------------------------

/// What the prober needs a rule for; without it, the prober fails as the variant says.
#[derive(Debug, Clone, Copy)]
enum ProberNeed {
    /// Cluster watch denied: no Cluster is ever reconciled, no probe runs.
    ClusterWatch,
    /// Secret watch denied: every API-server probe fails, nothing is scaled.
    SecretWatch,
    /// Machine watch denied: every lease probe fails, nothing is scaled.
    MachineWatch,
    /// Target watch denied: every flow fails at its first target.
    TargetWatch,
    /// Target patch denied: replicas and annotations are one patch; nothing is restored.
    TargetPatch,
    /// Event create denied: no event is written (refused events counted).
    EventCreate,
    /// Event patch denied: a repetition is not written (refused events counted).
    EventPatch,
    /// core/v1 event create in its namespace denied: the copy about its own pod is refused.
    PodEventCreate,
    /// core/v1 event patch denied: a repetition of the copy about its own pod is refused.
    PodEventPatch,
    /// Lease create denied: never leads, never reconciles.
    LeaseCreate,
    /// Lease get/update denied: never leads, never reconciles.
    LeaseGetUpdate,
}

fn prober_need(rule: &PolicyRule) -> Option<ProberNeed> {
    Some(match rule_key(rule).as_str() {
        "extensions.gardener.cloud/clusters:list,watch" => ProberNeed::ClusterWatch,
        "/secrets:list,watch" => ProberNeed::SecretWatch,
        "machine.sapcloud.io/machines:list,watch" => ProberNeed::MachineWatch,
        "apps/deployments:list,watch" => ProberNeed::TargetWatch,
        "apps/deployments:patch" => ProberNeed::TargetPatch,
        "events.k8s.io/events:create" => ProberNeed::EventCreate,
        "events.k8s.io/events:patch" => ProberNeed::EventPatch,
        "/events:create" => ProberNeed::PodEventCreate,
        "/events:patch" => ProberNeed::PodEventPatch,
        "coordination.k8s.io/leases:create" => ProberNeed::LeaseCreate,
        "coordination.k8s.io/leases:get,update" => ProberNeed::LeaseGetUpdate,
        _ => return None,
    })
}

/// The prober config of the runs: the shipped ConfigMap's (targets, levels, secret name) with
/// intervals shrunk to fractions of a second.
fn prober_test_config(shipped: &str) -> Result<String> {
    let mut config: Value =
        serde_saphyr::from_str(shipped).map_err(|e| anyhow!("shipped prober config: {e}"))?;
    config["probeInterval"] = "400ms".into();
    config["initialDelay"] = "200ms".into();
    config["probeTimeout"] = "3s".into();
    config["kcmNodeMonitorGraceDuration"] = "4s".into();
    for info in config["dependentResourceInfos"]
        .as_array_mut()
        .context("dependentResourceInfos")?
    {
        info["scaleUp"]["timeout"] = "10s".into();
        info["scaleDown"]["timeout"] = "10s".into();
    }
    // JSON is YAML.
    Ok(serde_json::to_string_pretty(&config)?)
}

/// Puts the restore shoot back: KCM scaled down with 3 replicas recorded, MCM scaled down
/// with an unusable record (restored to 1 replica, warned).
async fn reset_restore_shoot(plane: &SeedControlPlane) -> Result<()> {
    plane.scale_deployment(KCM, 0).await?;
    plane
        .set_deployment_annotation(KCM, REPLICAS_ANNOTATION, Some("3"))
        .await?;
    plane
        .set_deployment_annotation(KCM, MELTDOWN_ANNOTATION, Some(""))
        .await?;
    break_mcm(plane).await
}

/// Scales the restore shoot's MCM down behind the marker with an unusable record: the prober
/// restores it to 1 replica, with the same event each time (a repetition, for the series).
async fn break_mcm(plane: &SeedControlPlane) -> Result<()> {
    plane.scale_deployment(MCM, 0).await?;
    plane
        .set_deployment_annotation(MCM, REPLICAS_ANNOTATION, Some("two"))
        .await?;
    plane
        .set_deployment_annotation(MCM, MELTDOWN_ANNOTATION, Some(""))
        .await?;
    Ok(())
}

struct ProberWorld {
    admin: kube::Client,
    dir: PathBuf,
    component: Component,
    identity: Identity,
    config: PathBuf,
    outage: SimShoot,
    restore: SimShoot,
}

impl ProberWorld {
    fn start(&self, run: &str) -> Result<Watchdog> {
        start_watchdog(
            &self.component,
            run,
            &self.dir,
            &self.config,
            &self.identity.kubeconfig,
        )
    }

    async fn kcm_replicas(&self) -> Result<i32> {
        Ok(replicas_and_annotations(&deployment(&self.admin, RESTORE_NS, KCM).await?).0)
    }

    async fn cluster_uid(&self, ns: &str) -> Result<Option<String>> {
        Ok(
            Api::<DynamicObject>::all_with(self.admin.clone(), &dwd_sim::seed::cluster_resource())
                .get(ns)
                .await?
                .metadata
                .uid,
        )
    }
}

/// The restore shoot's scale-up as events about the Cluster and the failed MCM (with their
/// UIDs), and a repeated ScaledUp event counted on the first one as a series (patch).
async fn restore_shoot_events(w: &ProberWorld, run: &str) -> Result<()> {
    let admin = &w.admin;
    wait_replicas(admin, RESTORE_NS, &[(KCM, 3)], true).await?;
    let cluster_uid = w.cluster_uid(RESTORE_NS).await?;
    let decisions = wait_events(
        admin,
        run,
        "default",
        "Cluster",
        RESTORE_NS,
        REASON_SCALE_UP,
    )
    .await?;
    ensure!(
        uids(&decisions) == BTreeSet::from([cluster_uid]),
        "Cluster event UIDs {:?}",
        uids(&decisions)
    );
    let mcm_uid = deployment(admin, RESTORE_NS, MCM).await?.metadata.uid;
    let failures = wait_events(admin, run, RESTORE_NS, "Deployment", MCM, REASON_SCALED_UP).await?;
    ensure!(
        uids(&failures) == BTreeSet::from([mcm_uid]),
        "MCM event UIDs {:?}",
        uids(&failures)
    );
    // The same restoration again: counted on the first event as a series.
    wait_replicas(admin, RESTORE_NS, &[(MCM, 1)], true).await?;
    break_mcm(w.restore.seed()).await?;
    eventually(
        DEADLINE,
        "a repeated ScaledUp event counted as a series",
        || async {
            let found = events_of(admin, run, RESTORE_NS, "Deployment", MCM, REASON_SCALED_UP)
                .await
                .map_err(|e| e.to_string())?;
            Ok(found
                .iter()
                .any(|e| e.series.as_ref().is_some_and(|s| s.count >= 2))
                .then_some(()))
        },
    )
    .await
    .map_err(|e| anyhow!(e))
}

/// The per-shoot series only a running prober writes are in `text` (its /metrics): the outage
/// shoot's runs got room and findings, the last just now.
fn check_running_prober_series(text: &str) -> Result<()> {
    let scraped = sample_names(text);
    for name in RUNNING_PROBER_SERIES {
        ensure!(
            scraped.contains(*name),
            "{name} is not on the prober's /metrics"
        );
    }
    let waiting = sample(
        text,
        "dwd_prober_shoot_waiting_for_room",
        &[("shoot", OUTAGE_NS)],
    );
    ensure!(waiting == Some(0.0), "waiting for room: {waiting:?}");
    let found_at = sample(
        text,
        "dwd_prober_expired_lease_fraction_timestamp_seconds",
        &[("shoot", OUTAGE_NS)],
    )
    .context("no expired-lease fraction timestamp")?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs_f64();
    ensure!(
        (-5.0..DEADLINE.as_secs_f64()).contains(&(now - found_at)),
        "the last finding is {}s old",
        now - found_at
    );
    Ok(())
}

/// Nothing was denied to the prober `wd` (whose /metrics is `text`): every event written, no
/// forbidden call in the log.
fn nothing_denied(wd: &Watchdog, text: &str) -> Result<()> {
    let failed = sample(text, "dwd_events_total", &[("outcome", "Failed")]).unwrap_or(0.0);
    let published = sample(text, "dwd_events_total", &[("outcome", "Published")]).unwrap_or(0.0);
    ensure!(
        failed == 0.0 && published > 0.0,
        "events: {failed} failed, {published} published"
    );
    let log = wd.log().to_lowercase();
    ensure!(
        !log.contains("forbidden"),
        "a forbidden call\n{}",
        wd.tail()
    );
    ensure!(
        !log.contains("event not written"),
        "an event not written\n{}",
        wd.tail()
    );
    Ok(())
}

/// The whole job on exactly the shipped RBAC.
async fn prober_with_all_rules(w: &ProberWorld) -> Result<()> {
    let admin = &w.admin;
    let run = "rbac-prober-all-rules";
    reset_restore_shoot(w.restore.seed()).await?;
    delete_lease(admin, PROBER_LEASE).await?;
    let wd = w.start(run)?;
    wd.wait_log("caches synced; prober ready", 1).await?;

    // Restore shoot: KCM back at its recorded 3; the decision on the Cluster and the failed
    // MCM both as events with UIDs; a repeated event counted as a series (patch).
    restore_shoot_events(w, run).await?;

    // Outage shoot: 4 of 5 kubelets silent → all three targets at 0, per-shoot series on
    // /metrics; kubelets back → everything restored.
    let silenced = w.outage.kubelets().silence_count(4);
    ensure!(silenced.len() == 4);
    wait_replicas(admin, OUTAGE_NS, &[(KCM, 0), (MCM, 0), (CA, 0)], false).await?;
    let fraction = wd
        .sample("dwd_prober_expired_lease_fraction", &[("shoot", OUTAGE_NS)])
        .await?;
    ensure!(
        fraction >= 0.6,
        "expired fraction {fraction} during the outage"
    );
    // Its leases were expired at its last finding: a decision is pending (its runs get room
    // first; the alerts and the dashboard watch this series).
    wd.wait_sample(
        "dwd_prober_shoot_decision_pending",
        &[("shoot", OUTAGE_NS)],
        1.0,
    )
    .await?;
    let outage_uid = w.cluster_uid(OUTAGE_NS).await?;
    let down = wait_events(
        admin,
        run,
        "default",
        "Cluster",
        OUTAGE_NS,
        REASON_SCALE_DOWN,
    )
    .await?;
    ensure!(uids(&down) == BTreeSet::from([outage_uid.clone()]));
    for target in [KCM, MCM, CA] {
        wait_events(
            admin,
            run,
            OUTAGE_NS,
            "Deployment",
            target,
            REASON_SCALED_DOWN,
        )
        .await?;
    }
    w.outage.kubelets().resume_all();
    wait_replicas(admin, OUTAGE_NS, &[(KCM, 3), (MCM, 2), (CA, 2)], true).await?;
    let up = wait_events(admin, run, "default", "Cluster", OUTAGE_NS, REASON_SCALE_UP).await?;
    ensure!(uids(&up) == BTreeSet::from([outage_uid]));
    for target in [KCM, MCM, CA] {
        wait_events(
            admin,
            run,
            OUTAGE_NS,
            "Deployment",
            target,
            REASON_SCALED_UP,
        )
        .await?;
    }

    // The per-shoot series only a running prober writes are on /metrics (the dashboard and
    // the alerts use them): the outage shoot's runs got room and findings, the last just now.
    let text = wd.metrics().await?;
    check_running_prober_series(&text)?;

    // Nothing was denied: every event written, no forbidden call in the log.
    nothing_denied(&wd, &text)?;

    // It led all along (renewing needs update), and hands the Lease over on SIGTERM.
    ensure!(wd.exited().is_none(), "the prober exited\n{}", wd.tail());
    stop_leader(&wd, admin, PROBER_LEASE).await
}

/// The restore shoot's runs are skipped (two lease probe failures) for want of the watch on
/// `resource`, whose denied list is logged, and KCM stays at 0: nothing is scaled without
/// `what`.
async fn runs_skipped_unscaled(
    w: &ProberWorld,
    wd: &Watchdog,
    resource: &str,
    what: &str,
) -> Result<()> {
    wd.wait_sample(
        "dwd_prober_lease_probe_failures_total",
        &[("shoot", RESTORE_NS)],
        2.0,
    )
    .await?;
    wd.wait_log(&format!(r#"cannot list resource "{resource}""#), 1)
        .await?;
    ensure!(w.kcm_replicas().await? == 0, "scaled without {what}");
    Ok(())
}

/// The prober without one rule: it fails as `kind` predicts.
async fn prober_without(w: &ProberWorld, run: &str, kind: ProberNeed) -> Result<()> {
    let admin = &w.admin;
    reset_restore_shoot(w.restore.seed()).await?;
    delete_lease(admin, PROBER_LEASE).await?;
    let wd = w.start(run)?;
    let failed_up = |target: &'static str| {
        [
            ("direction", "Up"),
            ("target", target),
            ("outcome", "Failed"),
        ]
    };
    match kind {
        ProberNeed::ClusterWatch => {
            wd.wait_log(r#"cannot list resource "clusters""#, 2).await?;
            let reconciles = wd
                .sample("dwd_prober_cluster_reconciles_total", &[])
                .await?;
            let probes = wd.sample("dwd_prober_active_probes", &[]).await?;
            ensure!(
                reconciles == 0.0 && probes == 0.0,
                "reconciles {reconciles}, probes {probes}"
            );
            ensure!(w.kcm_replicas().await? == 0, "scaled without Clusters");
        }
        ProberNeed::SecretWatch => {
            // A run is skipped (counted as a lease probe failure) while a seed cache is not
            // synced: nothing decides from a cache that never listed.
            runs_skipped_unscaled(w, &wd, "secrets", "the probe secret").await?;
        }
        ProberNeed::MachineWatch => {
            runs_skipped_unscaled(w, &wd, "machines", "Machines").await?;
        }
        ProberNeed::TargetWatch => {
            // Runs are skipped while the target cache has not synced (see SecretWatch).
            runs_skipped_unscaled(w, &wd, "deployments", "the target cache").await?;
        }
        ProberNeed::TargetPatch => {
            wd.wait_sample("dwd_prober_scale_operations_total", &failed_up(KCM), 1.0)
                .await?;
            wd.wait_log(r#"cannot patch resource "deployments" in"#, 1)
                .await?;
            let (replicas, annotations) =
                replicas_and_annotations(&deployment(admin, RESTORE_NS, KCM).await?);
            ensure!(
                replicas == 0 && annotations.contains_key(REPLICAS_ANNOTATION),
                "KCM {replicas} {annotations:?}: changed without the patch permission"
            );
        }
        ProberNeed::EventCreate
        | ProberNeed::EventPatch
        | ProberNeed::PodEventCreate
        | ProberNeed::PodEventPatch => {
            let (verb, group) = match kind {
                ProberNeed::EventCreate => ("create", "events.k8s.io"),
                ProberNeed::EventPatch => ("patch", "events.k8s.io"),
                ProberNeed::PodEventCreate => ("create", ""),
                _ => ("patch", ""),
            };
            if matches!(kind, ProberNeed::EventPatch | ProberNeed::PodEventPatch) {
                // A repetition is what needs the patch: restore MCM a second time.
                wait_replicas(admin, RESTORE_NS, &[(MCM, 1)], true).await?;
                break_mcm(w.restore.seed()).await?;
            }
            event_refused(&wd, verb, group).await?;
            // Events are a side channel: scaling goes on.
            wait_replicas(admin, RESTORE_NS, &[(KCM, 3)], true).await?;
        }
        ProberNeed::LeaseCreate | ProberNeed::LeaseGetUpdate => {
            let creating = matches!(kind, ProberNeed::LeaseCreate);
            never_leads(&wd, admin, PROBER_LEASE, creating).await?;
            let reconciles = wd
                .sample("dwd_prober_cluster_reconciles_total", &[])
                .await?;
            ensure!(
                reconciles == 0.0,
                "a non-leader reconciled {reconciles} Clusters"
            );
            ensure!(w.kcm_replicas().await? == 0, "scaled without leading");
        }
    }
    wd.stop().await?;
    Ok(())
}

/// Permissions the prober's ServiceAccount must not have (a sample of what is not granted).
fn prober_forbidden() -> Vec<Perm> {
    let ns = Some(RESTORE_NS);
    vec![
        Perm::new("apps", "deployments", "delete", ns).named(KCM),
        Perm::new("apps", "deployments", "update", ns).named(KCM),
        Perm::new("apps", "deployments", "create", ns),
        Perm::new("apps", "deployments", "patch", ns).named("etcd-main"),
        Perm::new("apps", "deployments", "list", None),
        Perm::new("apps", "deployments/scale", "patch", ns).named("etcd-main"),
        Perm::new("apps", "deployments/scale", "update", ns).named(KCM),
        Perm::new("apps", "deployments/scale", "patch", ns).named(KCM),
        Perm::new("apps", "deployments", "get", ns).named(KCM),
        Perm::new("extensions.gardener.cloud", "clusters", "get", None).named(RESTORE_NS),
        Perm::new("apps", "statefulsets/scale", "patch", ns).named("etcd-main"),
        Perm::new("", "secrets", "get", ns).named("shoot-access-dependency-watchdog-probe"),
        Perm::new("", "secrets", "list", None),
        Perm::new("", "secrets", "list", ns),
        Perm::new("", "secrets", "watch", None).named("etcd-backup"),
        Perm::new("", "secrets", "create", ns),
        Perm::new("extensions.gardener.cloud", "clusters", "update", None).named(RESTORE_NS),
        Perm::new("extensions.gardener.cloud", "clusters", "patch", None).named(RESTORE_NS),
        Perm::new("extensions.gardener.cloud", "clusters", "delete", None).named(RESTORE_NS),
        Perm::new("machine.sapcloud.io", "machines", "get", ns),
        Perm::new("machine.sapcloud.io", "machines", "delete", ns),
        Perm::new("", "pods", "list", None),
        Perm::new("", "pods", "delete", ns),
        Perm::new("", "namespaces", "list", None),
        Perm::new("", "nodes", "list", None),
        Perm::new("", "events", "create", ns),
        Perm::new("events.k8s.io", "events", "delete", ns),
        Perm::new("events.k8s.io", "events", "list", None),
        Perm::new("coordination.k8s.io", "leases", "update", Some(GARDEN)).named(WEEDER_LEASE),
        Perm::new("coordination.k8s.io", "leases", "delete", Some(GARDEN)).named(PROBER_LEASE),
        Perm::new("coordination.k8s.io", "leases", "get", Some("kube-system")).named(PROBER_LEASE),
        Perm::new(
            "coordination.k8s.io",
            "leases",
            "create",
            Some("kube-system"),
        ),
        Perm::new("", "serviceaccounts/token", "create", Some(GARDEN))
            .named("dependency-watchdog-prober"),
        Perm::new(
            "rbac.authorization.k8s.io",
            "clusterroles",
            "escalate",
            None,
        ),
    ]
}

/// Checks what is not granted, and that discovery comes from `system:discovery`.
async fn check_not_granted(client: &kube::Client, forbidden: &[Perm]) -> Result<()> {
    for perm in forbidden {
        let (allowed, reason) = can(client, perm).await?;
        ensure!(!allowed, "may {perm}: {reason}");
    }
    for path in ["/api", "/apis", "/apis/apps/v1"] {
        let (allowed, reason) = can_get_path(client, path).await?;
        ensure!(
            allowed && reason.contains("system:discovery"),
            "discovery GET {path}: allowed={allowed} ({reason})"
        );
    }
    Ok(())
}

/// A run that led all along (its Lease held) stops on SIGTERM, exits cleanly and hands the
/// Lease `lease` over.
async fn stop_leader(wd: &Watchdog, admin: &kube::Client, lease: &str) -> Result<()> {
    ensure!(lease_holder(admin, lease).await?.is_some(), "no leader");
    let status = wd.stop().await?;
    ensure!(status.success(), "exit status {status}\n{}", wd.tail());
    ensure!(
        lease_holder(admin, lease).await?.is_none(),
        "Lease not released on shutdown"
    );
    Ok(())
}

/// A run denied the Lease (`creating` it, or getting it) tries twice and nobody holds `lease`.
async fn never_leads(
    wd: &Watchdog,
    admin: &kube::Client,
    lease: &str,
    creating: bool,
) -> Result<()> {
    let verb = if creating { "create" } else { "get" };
    wd.wait_log(&format!(r#"cannot {verb} resource "leases""#), 2)
        .await?;
    ensure!(lease_holder(admin, lease).await?.is_none(), "someone leads");
    Ok(())
}

/// A run denied `verb` on the events of API group `group` counts a refused event and logs the
/// denial.
async fn event_refused(wd: &Watchdog, verb: &str, group: &str) -> Result<()> {
    wd.wait_sample("dwd_events_total", &[("outcome", "Refused")], 1.0)
        .await?;
    wd.wait_log(
        &format!(r#"cannot {verb} resource "events" in API group "{group}""#),
        1,
    )
    .await?;
    Ok(())
}

/// For each rule: the access reviews say exactly that rule's permissions are gone.
async fn apply_without(
    admin: &kube::Client,
    c: &Component,
    id: RuleId,
    identity: &Identity,
    sample_ns: &str,
) -> Result<()> {
    apply_rbac(admin, &c.without(id)).await?;
    let expect: Vec<(Perm, bool)> = all_perms(c, sample_ns)
        .into_iter()
        .map(|(rule, p)| (p, rule != id))
        .collect();
    wait_access(&identity.client, &expect).await
}

/// The contract of a component's shipped RBAC, checked on `identity`: with exactly the
/// shipped rules everything they grant is granted and nothing of `forbidden`, and `all_rules`
/// (the whole job) succeeds; then, without each rule in turn (named by `need`: a rule without a
/// behavioural check fails the test), `without` shows the failure the rule prevents. Ends with
/// the shipped rules applied again and granted.
#[allow(clippy::too_many_arguments)]
async fn check_every_rule<Need: std::fmt::Debug + Copy>(
    admin: &kube::Client,
    component: &Component,
    identity: &Identity,
    sample_ns: &str,
    forbidden: &[Perm],
    need: fn(&PolicyRule) -> Option<Need>,
    all_rules: impl AsyncFnOnce() -> Result<()>,
    without: impl AsyncFn(&str, Need) -> Result<()>,
) -> Result<()> {
    let name = &component.name;
    let started = Instant::now();
    // Exactly the shipped rules: everything granted, nothing else.
    let all: Vec<(Perm, bool)> = all_perms(component, sample_ns)
        .into_iter()
        .map(|(_, p)| (p, true))
        .collect();
    wait_access(&identity.client, &all).await?;
    check_not_granted(&identity.client, forbidden).await?;
    all_rules().await.context("with every shipped rule")?;
    eprintln!("{name} with all rules: {:?}", started.elapsed());

    // Without each rule in turn.
    for (id, rule) in component.rules() {
        let desc = describe_rule(&rule);
        let kind = need(&rule)
            .with_context(|| format!("rule {desc} has no behavioural check: add one"))?;
        let t = Instant::now();
        apply_without(admin, component, id, identity, sample_ns)
            .await
            .with_context(|| format!("access without {desc}"))?;
        let run = match id {
            RuleId::Cluster(i) => format!("rbac-{name}-without-clusterrole-rule-{i}"),
            RuleId::Namespaced(i) => format!("rbac-{name}-without-role-rule-{i}"),
        };
        without(&run, kind)
            .await
            .with_context(|| format!("without {desc} ({kind:?})"))?;
        eprintln!("{name} without {desc}: {kind:?} shown in {:?}", t.elapsed());
    }
    apply_rbac(admin, component).await?;
    wait_access(&identity.client, &all).await
}

#[tokio::test]
async fn prober_works_with_exactly_the_shipped_rbac_and_needs_every_rule() -> Result<()> {
    let started = Instant::now();
    let seed = seed().await?;
    let admin = seed.client().await?;
    let shoots = env().await?.start_apiserver("rbac-shoot").await?;
    let component = Component::load("prober")?;
    let identity = identity(seed, &admin, &component).await?;
    let dir = work_dir().await?;
    let config = dir.join("prober-dep-config.yaml");
    std::fs::write(&config, prober_test_config(&component.config()?)?)?;

    let shoot = |ns: &str, prefix: &str, nodes: usize| {
        let mut options = SimShootOptions::new(ns)
            .with_nodes(nodes)
            .with_renew_interval(Duration::from_millis(250));
        options.node_prefix = prefix.into();
        options.deployments = vec![(KCM.into(), 3), (MCM.into(), 2), (CA.into(), 2)];
        options
    };
    let outage = SimShoot::create(
        admin.clone(),
        shoots.client().await?,
        shoots.kubeconfig(),
        shoot(OUTAGE_NS, "outage-", 5),
    )
    .await?;
    let restore = SimShoot::create(
        admin.clone(),
        shoots.client().await?,
        shoots.kubeconfig(),
        shoot(RESTORE_NS, "restore-", 2),
    )
    .await?;
    let w = ProberWorld {
        admin: admin.clone(),
        dir,
        component: component.clone(),
        identity,
        config,
        outage,
        restore,
    };

    check_every_rule(
        &admin,
        &component,
        &w.identity,
        RESTORE_NS,
        &prober_forbidden(),
        prober_need,
        || prober_with_all_rules(&w),
        async |run, kind| prober_without(&w, run, kind).await,
    )
    .await?;
    drop(w);
    shoots.stop().await?;
    eprintln!("prober RBAC test: {:?}", started.elapsed());
    Ok(())
}

// --- 3. the weeder --------------------------------------------------------------------------

/// What the weeder needs a rule for; without it, the weeder fails as the variant says.
#[derive(Debug, Clone, Copy)]
enum WeederNeed {
    /// EndpointSlice watch denied: never lists the slices, never starts a weeder.
    SliceWatch,
    /// Pod watch denied: the weeder can't see the dependants.
    PodWatch,
    /// Pod delete denied: the crash-looping pod stays.
    PodDelete,
    /// Event create denied: the deletion's event is not written.
    EventCreate,
    /// core/v1 event create in its namespace denied: the copy about its own pod is refused.
    PodEventCreate,
    /// Lease create denied: never leads.
    LeaseCreate,
    /// Lease get/update denied: never leads.
    LeaseGetUpdate,
}

fn weeder_need(rule: &PolicyRule) -> Option<WeederNeed> {
    Some(match rule_key(rule).as_str() {
        "discovery.k8s.io/endpointslices:list,watch" => WeederNeed::SliceWatch,
        "/pods:list,watch" => WeederNeed::PodWatch,
        "/pods:delete" => WeederNeed::PodDelete,
        "events.k8s.io/events:create" => WeederNeed::EventCreate,
        "/events:create" => WeederNeed::PodEventCreate,
        "coordination.k8s.io/leases:create" => WeederNeed::LeaseCreate,
        "coordination.k8s.io/leases:get,update" => WeederNeed::LeaseGetUpdate,
        _ => return None,
    })
}

struct WeederWorld {
    admin: kube::Client,
    dir: PathBuf,
    component: Component,
    identity: Identity,
    config: PathBuf,
    plane: SeedControlPlane,
}

impl WeederWorld {
    /// A crash-looping kube-apiserver pod, etcd-main-client ready or not; returns the pod's UID.
    async fn prepare(&self, etcd_ready: bool) -> Result<String> {
        let state = if etcd_ready {
            EndpointsState::AllReady
        } else {
            EndpointsState::NotReady
        };
        self.plane
            .set_endpoint_slice(ETCD_SERVICE, 1, state)
            .await?;
        if self.pod_uid().await?.is_none() {
            self.plane
                .create_crashlooping_pod(WEEDER_POD, &[("role", "apiserver")])
                .await?;
        }
        self.pod_uid().await?.context("no pod")
    }

    async fn pod_uid(&self) -> Result<Option<String>> {
        Ok(
            Api::<k8s_openapi::api::core::v1::Pod>::namespaced(self.admin.clone(), WEEDER_NS)
                .get_opt(WEEDER_POD)
                .await?
                .and_then(|p| p.metadata.uid),
        )
    }

    async fn wait_pod_gone(&self) -> Result<()> {
        eventually(DEADLINE, "crash-looping pod deleted", || async {
            Ok(self
                .pod_uid()
                .await
                .map_err(|e| e.to_string())?
                .is_none()
                .then_some(()))
        })
        .await
        .map_err(|e| anyhow!(e))
    }

    fn start(&self, run: &str) -> Result<Watchdog> {
        start_watchdog(
            &self.component,
            run,
            &self.dir,
            &self.config,
            &self.identity.kubeconfig,
        )
    }
}

/// Logged when the replica starts leading (and so starts the work). With leader election the
/// weeder does not log when its first slice list is through (its readiness already came with
/// the election), so the runs can't wait for that; they don't need to either: a slice that is
/// ready when listed starts a weeder just like one turning ready later.
const LEADING: &str = "became leader";

async fn weeder_with_all_rules(w: &WeederWorld) -> Result<()> {
    let run = "rbac-weeder-all-rules";
    let uid = w.prepare(false).await?;
    delete_lease(&w.admin, WEEDER_LEASE).await?;
    let wd = w.start(run)?;
    wd.wait_log(LEADING, 1).await?;
    w.plane
        .set_endpoint_slice(ETCD_SERVICE, 1, EndpointsState::AllReady)
        .await?;
    w.wait_pod_gone().await?;
    let events = wait_events(
        &w.admin,
        run,
        WEEDER_NS,
        "Pod",
        WEEDER_POD,
        REASON_POD_DELETED,
    )
    .await?;
    ensure!(
        uids(&events) == BTreeSet::from([Some(uid)]),
        "UIDs {:?}",
        uids(&events)
    );
    wd.wait_sample(
        "dwd_weeder_pods_deleted_total",
        &[("service", ETCD_SERVICE)],
        1.0,
    )
    .await?;
    wd.wait_sample("dwd_events_total", &[("outcome", "Published")], 1.0)
        .await?;
    let failed = wd
        .sample("dwd_events_total", &[("outcome", "Failed")])
        .await?;
    ensure!(failed == 0.0, "{failed} events failed\n{}", wd.tail());
    ensure!(
        !wd.log().to_lowercase().contains("forbidden"),
        "a forbidden call\n{}",
        wd.tail()
    );
    stop_leader(&wd, &w.admin, WEEDER_LEASE).await
}

async fn weeder_without(w: &WeederWorld, run: &str, kind: WeederNeed) -> Result<()> {
    // Where the weeder can't even start, etcd is ready from the start: a working weeder would
    // act on its first slice list.
    let etcd_ready_at_start = matches!(
        kind,
        WeederNeed::SliceWatch | WeederNeed::LeaseCreate | WeederNeed::LeaseGetUpdate
    );
    let uid = w.prepare(etcd_ready_at_start).await?;
    delete_lease(&w.admin, WEEDER_LEASE).await?;
    let wd = w.start(run)?;
    let kept = || async {
        ensure!(
            w.pod_uid().await? == Some(uid.clone()),
            "the crash-looping pod was deleted"
        );
        Ok::<_, anyhow::Error>(())
    };
    let weeders = || wd.sample("dwd_weeder_active_weeders", &[]);
    match kind {
        WeederNeed::SliceWatch => {
            // Two attempts: our own warning, once per attempt of the slice watch.
            wd.wait_log_lines(
                &[
                    "endpoint slice watch failed, retrying",
                    r#"cannot list resource "endpointslices""#,
                ],
                2,
            )
            .await?;
            ensure!(weeders().await? == 0.0, "a weeder started without slices");
            kept().await?;
        }
        WeederNeed::LeaseCreate | WeederNeed::LeaseGetUpdate => {
            let creating = matches!(kind, WeederNeed::LeaseCreate);
            never_leads(&wd, &w.admin, WEEDER_LEASE, creating).await?;
            ensure!(!wd.log().contains(LEADING), "led without the Lease");
            ensure!(weeders().await? == 0.0, "a weeder started without leading");
            kept().await?;
        }
        WeederNeed::PodWatch
        | WeederNeed::PodDelete
        | WeederNeed::EventCreate
        | WeederNeed::PodEventCreate => {
            wd.wait_log(LEADING, 1).await?;
            w.plane
                .set_endpoint_slice(ETCD_SERVICE, 1, EndpointsState::AllReady)
                .await?;
            match kind {
                WeederNeed::PodWatch => {
                    // A streaming list is a watch request (list + watch only where the seed
                    // lacks WatchList).
                    wd.wait_log(r#"cannot watch resource "pods""#, 1).await?;
                    kept().await?;
                }
                WeederNeed::PodDelete => {
                    wd.wait_log(r#"cannot delete resource "pods""#, 1).await?;
                    kept().await?;
                }
                _ => {
                    let group = if matches!(kind, WeederNeed::EventCreate) {
                        "events.k8s.io"
                    } else {
                        ""
                    };
                    w.wait_pod_gone().await?;
                    event_refused(&wd, "create", group).await?;
                }
            }
            ensure!(weeders().await? == 1.0, "the service's weeder runs");
        }
    }
    wd.stop().await?;
    Ok(())
}

fn weeder_forbidden() -> Vec<Perm> {
    let ns = Some(WEEDER_NS);
    vec![
        Perm::new("", "pods", "get", ns).named(WEEDER_POD),
        Perm::new("", "pods", "patch", ns).named(WEEDER_POD),
        Perm::new("", "pods", "create", ns),
        Perm::new("", "pods", "deletecollection", ns),
        Perm::new("", "pods/eviction", "create", ns).named(WEEDER_POD),
        Perm::new("", "endpoints", "list", None),
        Perm::new("discovery.k8s.io", "endpointslices", "delete", ns),
        Perm::new("discovery.k8s.io", "endpointslices", "get", ns).named("etcd-main-client"),
        Perm::new("", "secrets", "list", None),
        Perm::new("apps", "deployments", "patch", ns).named(KCM),
        Perm::new("apps", "deployments/scale", "patch", ns).named(KCM),
        Perm::new("extensions.gardener.cloud", "clusters", "list", None),
        Perm::new("events.k8s.io", "events", "patch", ns),
        Perm::new("", "events", "create", ns),
        Perm::new("coordination.k8s.io", "leases", "update", Some(GARDEN)).named(PROBER_LEASE),
        Perm::new("coordination.k8s.io", "leases", "delete", Some(GARDEN)).named(WEEDER_LEASE),
    ]
}

#[tokio::test]
async fn weeder_works_with_exactly_the_shipped_rbac_and_needs_every_rule() -> Result<()> {
    let started = Instant::now();
    let seed = seed().await?;
    let admin = seed.client().await?;
    let component = Component::load("weeder")?;
    let identity = identity(seed, &admin, &component).await?;
    // The shipped config as it is (watchDuration 5m outlives every run).
    let dir = work_dir().await?;
    let config = dir.join("weeder-dep-config.yaml");
    std::fs::write(&config, component.config()?)?;
    let plane = SeedControlPlane::new(admin.clone(), WEEDER_NS);
    plane.create_namespace().await?;
    let w = WeederWorld {
        admin: admin.clone(),
        dir,
        component: component.clone(),
        identity,
        config,
        plane,
    };

    check_every_rule(
        &admin,
        &component,
        &w.identity,
        WEEDER_NS,
        &weeder_forbidden(),
        weeder_need,
        || weeder_with_all_rules(&w),
        async |run, kind| weeder_without(&w, run, kind).await,
    )
    .await?;
    eprintln!("weeder RBAC test: {:?}", started.elapsed());
    Ok(())
}
