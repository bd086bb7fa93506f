//! Watching the real objects and the real watchdog, and narrating what changed.
//!
//! Four background tasks keep a [`View`] of the sandbox up to date and write the timeline:
//! - every 250 ms, the shoots' node leases (expired by the prober's rule: what the prober is
//!   about to see) and the prober's and weeder's `/metrics`: probe runs, the expired-lease
//!   fraction the prober found (both sampled for the charts), API-server probe failures,
//!   scaling decisions, active weeders, deleted pods;
//! - the seed's controller Deployments: every replica change, with the level it belongs to;
//! - the seed's control-plane pods: crash loops and deletions (and, playing the ReplicaSets
//!   that would run in a real seed, a replacement for every deleted kube-apiserver or
//!   kube-scheduler pod; playing the endpoints controller, the kube-apiserver service ready
//!   again once a replacement kube-apiserver runs);
//! - the watchdog's Kubernetes Events about Clusters, and its warnings.
//!
//! The story and the interactive `status` command read the [`View`]; nothing here changes
//! what the watchdog sees except the replacement pods.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dwd_sim::{AbortOnDrop, SeedControlPlane};
use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event as KubeEvent;
use kube::api::{Api, ListParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch};

use crate::config::{
    ETCD_SERVICE, KUBE_APISERVER_LABELS, KUBE_APISERVER_SERVICE, KUBE_SCHEDULER_LABELS,
    SandboxConfig,
};
use crate::journal::{Journal, MarkerKind, lock};
use crate::metrics::{Scrape, scrape};

/// The annotations the prober writes on a target it holds at 0 (the protocol's constants).
pub(crate) use dwd_core::scaling::{MELTDOWN_ANNOTATION, REPLICAS_ANNOTATION};
/// Endpoints of the simulated etcd-main-client (Gardener runs etcd-main with 3 in HA).
pub(crate) const ETCD_ENDPOINTS: usize = 3;
/// Endpoints of the simulated kube-apiserver service: one per kube-apiserver pod.
pub(crate) const KUBE_APISERVER_ENDPOINTS: usize = crate::sandbox::KUBE_APISERVER_PODS;

/// One simulated control-plane pod as last seen.
#[derive(Debug, Clone)]
pub(crate) struct PodView {
    /// Label `role`.
    pub role: String,
    /// Whether a container waits in CrashLoopBackOff.
    pub crashlooping: bool,
    /// Whether its deletion was seen (and narrated).
    pub deleted: bool,
}

/// A replica change of one controller.
#[derive(Debug, Clone)]
pub(crate) struct ReplicaChange {
    /// Seconds since start.
    pub t: f64,
    /// Controller (Deployment) name.
    pub controller: String,
    /// Replicas after.
    pub to: i32,
}

/// One zone of a shoot (nodes labelled `topology.kubernetes.io/zone`).
#[derive(Debug, Clone, Default)]
pub(crate) struct ZoneView {
    /// Its nodes.
    pub nodes: Vec<String>,
    /// Last expired fraction the prober reported for it.
    pub fraction: Option<f64>,
    /// Whether the prober reports it disrupted (`dwd_prober_zone_disrupted`).
    pub disrupted: bool,
    /// Expired leases of its nodes as the sandbox last read them.
    pub lease_expired: Option<usize>,
}

/// What the sandbox knows about one shoot.
#[derive(Debug, Clone)]
pub(crate) struct ShootView {
    /// Short name (`alpha`).
    pub name: String,
    /// Shoot namespace in the seed.
    pub namespace: String,
    /// Node count (every node is a candidate in the sandbox).
    pub nodes: usize,
    /// `nodeLeaseFailureFraction` of the prober config.
    pub threshold: f64,
    /// `zoneLeaseFailureFraction` of the prober config.
    pub zone_threshold: f64,
    /// Zone → what is known of it (empty: a shoot without zone labels).
    pub zones: BTreeMap<String, ZoneView>,
    /// `(name, short name)` of the scalable controllers, in the config's order.
    pub controllers: Vec<(String, String)>,
    /// Successful probe runs (`dwd_prober_shoot_probe_runs_total`); `None` before the first.
    pub probe_runs: Option<u64>,
    /// Last expired-lease fraction the prober reported.
    pub fraction: Option<f64>,
    /// API-server probe failures so far.
    pub api_failures: u64,
    /// Lease probe failures so far.
    pub lease_failures: u64,
    /// Scale-down flows started.
    pub attempts_down: u64,
    /// Scale-up flows started.
    pub attempts_up: u64,
    /// Controller → `spec.replicas`.
    pub replicas: BTreeMap<String, i32>,
    /// Controller → `status.readyReplicas`.
    pub ready: BTreeMap<String, i32>,
    /// Controller → its annotations.
    pub annotations: BTreeMap<String, BTreeMap<String, String>>,
    /// Every replica change seen, in order.
    pub changes: Vec<ReplicaChange>,
    /// Control-plane pods by name.
    pub pods: BTreeMap<String, PodView>,
    /// `(t, pod)` of every deletion seen.
    pub deleted: Vec<(f64, String)>,
    /// Role → index of its next replacement pod.
    pub next_pod: BTreeMap<String, usize>,
    /// Whether etcd-main-client is ready (set by the sandbox's own actions).
    pub etcd_ready: bool,
    /// When etcd-main-client last turned ready.
    pub etcd_ready_since: Option<f64>,
    /// Whether the kube-apiserver service has ready endpoints.
    pub kube_apiserver_ready: bool,
    /// When it last turned ready.
    pub kube_apiserver_ready_since: Option<f64>,
    /// Whether the shoot's API server runs.
    pub apiserver_up: bool,
    /// Silenced kubelets.
    pub silenced: usize,
    /// Expired node leases as the sandbox last read them.
    pub lease_expired: Option<usize>,
    /// Whether the last API-server probe failed (to narrate transitions only).
    api_failing: bool,
}

impl ShootView {
    /// A fresh view of a shoot.
    pub(crate) fn new(name: &str, namespace: &str, nodes: usize, config: &SandboxConfig) -> Self {
        ShootView {
            name: name.into(),
            namespace: namespace.into(),
            nodes,
            threshold: config.threshold(),
            zone_threshold: config.zone_threshold(),
            zones: BTreeMap::new(),
            controllers: config
                .controllers
                .iter()
                .map(|c| (c.name.clone(), c.short.clone()))
                .collect(),
            probe_runs: None,
            fraction: None,
            api_failures: 0,
            lease_failures: 0,
            attempts_down: 0,
            attempts_up: 0,
            replicas: BTreeMap::new(),
            ready: BTreeMap::new(),
            annotations: BTreeMap::new(),
            changes: Vec::new(),
            pods: BTreeMap::new(),
            deleted: Vec::new(),
            next_pod: BTreeMap::new(),
            etcd_ready: true,
            etcd_ready_since: None,
            kube_apiserver_ready: true,
            kube_apiserver_ready_since: None,
            apiserver_up: true,
            silenced: 0,
            lease_expired: None,
            api_failing: false,
        }
    }

    /// The same shoot with its nodes in zones (zone → node names).
    pub(crate) fn with_zones(mut self, zones: &BTreeMap<String, Vec<String>>) -> Self {
        self.zones = zones
            .iter()
            .map(|(z, nodes)| {
                (
                    z.clone(),
                    ZoneView {
                        nodes: nodes.clone(),
                        ..ZoneView::default()
                    },
                )
            })
            .collect();
        self
    }

    /// `eu-1a 1.00 ≥ 0.60 (disrupted), eu-1b 0.00, eu-1c 0.00` as the prober reported them;
    /// `None` for a shoot without zones.
    pub(crate) fn zones_text(&self) -> Option<String> {
        if self.zones.is_empty() {
            return None;
        }
        let t = self.zone_threshold;
        Some(
            self.zones
                .iter()
                .map(|(z, v)| match v.fraction {
                    Some(f) => format!(
                        "{z} {f:.2} {} {t:.2}{}",
                        if f >= t { "≥" } else { "<" },
                        if v.disrupted { " (disrupted)" } else { "" }
                    ),
                    None => format!("{z} not reported yet (the prober reports zones once it lists the nodes: after a lease expired)"),
                })
                .collect::<Vec<_>>()
                .join(", "),
        )
    }

    /// `KCM 2 (ready 2), MCM 1 (ready 1), CA 1 (ready 1)`.
    pub(crate) fn replicas_text(&self) -> String {
        self.controllers
            .iter()
            .map(|(c, short)| {
                let spec = self.replicas.get(c).map_or("?".to_string(), i32::to_string);
                let ready = self.ready.get(c).map_or("?".to_string(), i32::to_string);
                format!("{short} {spec} (ready {ready})")
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `4/5 leases expired, 0.80 ≥ 0.60` for a fraction the prober reported.
    pub(crate) fn leases_text(&self, fraction: f64) -> String {
        let expired = (fraction * self.nodes as f64).round() as usize;
        let threshold = self.threshold;
        let cmp = if fraction >= threshold { "≥" } else { "<" };
        format!(
            "{expired}/{} leases expired, {fraction:.2} {cmp} {threshold:.2}",
            self.nodes
        )
    }

    /// Whether every controller is at `want` replicas (spec and ready).
    pub(crate) fn controllers_at(&self, want: &[(&str, i32)]) -> bool {
        want.iter().all(|(c, n)| {
            self.replicas.get(*c) == Some(n)
                && (if *n == 0 {
                    self.ready.get(*c) == Some(&0)
                } else {
                    self.ready.get(*c).is_some_and(|r| *r >= 1)
                })
        })
    }
}

/// What the sandbox knows, shared between the monitor tasks and the story.
#[derive(Debug, Clone, Default)]
pub(crate) struct View {
    /// Shoots in order.
    pub shoots: Vec<ShootView>,
    /// `dwd_weeder_active_weeders`.
    pub active_weeders: Option<i64>,
    /// Pods the weeder deleted (all services).
    pub weeder_deleted: u64,
    /// Whether the prober's metrics answered at the last poll.
    pub prober_reachable: bool,
    /// Whether the weeder's metrics answered at the last poll.
    pub weeder_reachable: bool,
}

impl View {
    /// The shoot with this short name.
    pub(crate) fn shoot(&self, name: &str) -> Option<&ShootView> {
        self.shoots.iter().find(|s| s.name == name)
    }

    /// The shoot with this short name, mutable.
    pub(crate) fn shoot_mut(&mut self, name: &str) -> Option<&mut ShootView> {
        self.shoots.iter_mut().find(|s| s.name == name)
    }

    fn by_namespace(&mut self, namespace: &str) -> Option<&mut ShootView> {
        self.shoots.iter_mut().find(|s| s.namespace == namespace)
    }
}

/// Shared handle on the view.
pub(crate) type SharedView = Arc<Mutex<View>>;

/// Brings the view up to date with the watchdog's metrics and the shoots' leases, and
/// narrates what changed. Refreshes are serialised: narration must follow the order in which
/// things were observed, and a slow scrape must never be processed after a newer one.
pub(crate) struct Refresher {
    journal: Arc<Journal>,
    config: Arc<SandboxConfig>,
    view: SharedView,
    prober: SocketAddr,
    weeder: SocketAddr,
    /// `(short name, shoot client)`: to read the node leases.
    shoots: Vec<(String, kube::Client)>,
    serial: tokio::sync::Mutex<()>,
}

impl Refresher {
    /// Scrapes both watchdogs, reads the leases, updates the view and narrates.
    pub(crate) async fn refresh(&self) {
        let _turn = self.serial.lock().await;
        let validity = self.config.lease_validity_seconds();
        let leases =
            futures::future::join_all(self.shoots.iter().map(|(name, client)| async move {
                (name.clone(), expired_leases(client, validity).await)
            }));
        let (p, w, leases) = futures::join!(scrape(self.prober), scrape(self.weeder), leases);
        let journal = &self.journal;
        let config = &self.config;
        let mut v = lock(&self.view);
        for (name, expired) in leases {
            if let Some(shoot) = v.shoot_mut(&name) {
                on_leases(journal, config, shoot, expired);
            }
        }
        match p {
            Ok(s) => {
                v.prober_reachable = true;
                for shoot in &mut v.shoots {
                    on_prober_scrape(journal, config, shoot, &s);
                }
            }
            Err(_) => {
                v.prober_reachable = false;
                for shoot in &v.shoots {
                    journal.sample_fraction(&shoot.name, None);
                }
            }
        }
        match w {
            Ok(s) => {
                v.weeder_reachable = true;
                on_weeder_scrape(journal, config, &mut v, &s);
            }
            Err(_) => v.weeder_reachable = false,
        }
    }
}

/// Starts every monitor task; they stop when the returned handles are dropped.
pub(crate) fn start(
    journal: Arc<Journal>,
    config: Arc<SandboxConfig>,
    view: SharedView,
    seed: kube::Client,
    shoots: Vec<(String, kube::Client)>,
    prober_metrics: SocketAddr,
    weeder_metrics: SocketAddr,
) -> Vec<AbortOnDrop> {
    let refresher = Arc::new(Refresher {
        journal: journal.clone(),
        config: config.clone(),
        view: view.clone(),
        prober: prober_metrics,
        weeder: weeder_metrics,
        shoots,
        serial: tokio::sync::Mutex::new(()),
    });
    vec![
        AbortOnDrop::spawn(poll(refresher.clone())),
        AbortOnDrop::spawn(watch_deployments(
            journal.clone(),
            config,
            view.clone(),
            seed.clone(),
            refresher.clone(),
        )),
        AbortOnDrop::spawn(watch_pods(
            journal.clone(),
            view.clone(),
            seed.clone(),
            refresher.clone(),
        )),
        AbortOnDrop::spawn(watch_events(journal, view, seed, refresher)),
    ]
}

// --- metrics and leases -------------------------------------------------------------------

async fn poll(refresher: Arc<Refresher>) {
    let mut ticker = tokio::time::interval(Duration::from_millis(250));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        refresher.refresh().await;
    }
}

/// `(expired lease names, candidates)` of a shoot's node leases now, by the prober's rule
/// (expired when not renewed for `validity` = 0.75 × kcmNodeMonitorGraceDuration seconds, or
/// never renewed); `None` when the shoot's API server does not answer.
async fn expired_leases(client: &kube::Client, validity: f64) -> Option<(Vec<String>, usize)> {
    let api: Api<Lease> = Api::namespaced(client.clone(), dwd_core::lease::NODE_LEASE_NAMESPACE);
    let list = tokio::time::timeout(Duration::from_secs(1), api.list(&ListParams::default()))
        .await
        .ok()?
        .ok()?;
    let now = chrono::Utc::now().timestamp_micros();
    let limit = (validity * 1e6) as i64;
    let expired = list
        .items
        .iter()
        .filter(|l| {
            l.spec
                .as_ref()
                .and_then(|s| s.renew_time.as_ref())
                .is_none_or(|t| now - t.0.as_microsecond() >= limit)
        })
        .filter_map(|l| l.metadata.name.clone())
        .collect();
    Some((expired, list.items.len()))
}

fn on_leases(
    journal: &Journal,
    config: &SandboxConfig,
    shoot: &mut ShootView,
    expired: Option<(Vec<String>, usize)>,
) {
    let name = shoot.name.clone();
    let Some((expired_names, candidates)) = expired else {
        journal.sample_lease_truth(&name, None);
        for zone in shoot.zones.keys() {
            journal.sample_zone_truth(&name, zone, None);
        }
        return;
    };
    let expired = expired_names.len();
    // Per zone: what the prober's zone rule is about to see.
    let mut zones_changed = false;
    let mut zone_notes = Vec::new();
    for (zone, z) in &mut shoot.zones {
        let n = z
            .nodes
            .iter()
            .filter(|node| expired_names.contains(node))
            .count();
        let total = z.nodes.len();
        journal.sample_zone_truth(
            &name,
            zone,
            Some(if total == 0 {
                0.0
            } else {
                n as f64 / total as f64
            }),
        );
        zones_changed |= z.lease_expired != Some(n);
        z.lease_expired = Some(n);
        if n > 0 {
            zone_notes.push(format!(
                "zone {zone} {}",
                fraction_text(n, total, config.zone_threshold())
            ));
        }
    }
    let fraction = if candidates == 0 {
        0.0
    } else {
        expired as f64 / candidates as f64
    };
    journal.sample_lease_truth(&name, Some(fraction));
    if shoot.lease_expired == Some(expired) && !zones_changed {
        return;
    }
    let why = match shoot.lease_expired {
        None => None,
        Some(old) if expired > old => Some(format!(
            "not renewed for {}s = 0.75 × kcmNodeMonitorGraceDuration {}s",
            config.lease_validity_seconds(),
            config.grace_seconds()
        )),
        Some(_) => Some("renewed again".into()),
    };
    shoot.lease_expired = Some(expired);
    let zones = if zone_notes.is_empty() {
        String::new()
    } else {
        format!("; {}", zone_notes.join(", "))
    };
    journal.log(
        &name,
        format!(
            "node leases: {}{zones}",
            fraction_text(expired, candidates, config.threshold())
        ),
        why,
    );
}

/// `4/5 expired (0.80 ≥ 0.60)`.
pub(crate) fn fraction_text(expired: usize, candidates: usize, threshold: f64) -> String {
    let fraction = if candidates == 0 {
        0.0
    } else {
        expired as f64 / candidates as f64
    };
    let cmp = if fraction >= threshold { "≥" } else { "<" };
    format!("{expired}/{candidates} expired ({fraction:.2} {cmp} {threshold:.2})")
}

/// Takes the prober's per-zone fractions and disruptions from a scrape into `shoot` (each zone
/// charted; a zone's state taken only when a new probe run, `runs`, came); returns the
/// disrupted zones, each as a line of why.
fn update_zones(
    journal: &Journal,
    shoot: &mut ShootView,
    s: &Scrape,
    runs: Option<u64>,
) -> Vec<String> {
    let ns = shoot.namespace.clone();
    let label = [("shoot", ns.as_str())];
    let zone_fractions: BTreeMap<String, f64> = s
        .all("dwd_prober_zone_expired_lease_fraction", &label)
        .filter_map(|x| x.labels.get("zone").map(|z| (z.clone(), x.value)))
        .collect();
    let disrupted: BTreeMap<String, bool> = s
        .all("dwd_prober_zone_disrupted", &label)
        .filter_map(|x| x.labels.get("zone").map(|z| (z.clone(), x.value >= 1.0)))
        .collect();
    for zone in zone_fractions.keys() {
        // A zone the sandbox did not make (a label changed by hand) still gets charted.
        shoot.zones.entry(zone.clone()).or_default();
    }
    for (zone, z) in &mut shoot.zones {
        let f = zone_fractions.get(zone).copied();
        journal.sample_zone_fraction(&shoot.name, zone, f);
        if runs.unwrap_or(0) > shoot.probe_runs.unwrap_or(0) {
            z.fraction = f.or(z.fraction);
            z.disrupted = disrupted.get(zone).copied().unwrap_or(false);
        }
    }
    shoot
        .zones
        .iter()
        .filter(|(_, z)| z.disrupted)
        .map(|(zone, z)| {
            format!(
                "zone {zone} at {:.2} ≥ zoneLeaseFailureFraction {:.2}",
                z.fraction.unwrap_or(1.0),
                shoot.zone_threshold
            )
        })
        .collect()
}

/// What the prober's metrics say of one shoot in a scrape.
struct ProberCounts {
    /// Probe runs (none before the first).
    runs: Option<u64>,
    /// The expired-lease fraction of the last run.
    fraction: Option<f64>,
    api_failures: u64,
    lease_failures: u64,
    /// Scaling attempts down and up.
    down: u64,
    up: u64,
}

impl ProberCounts {
    fn of(s: &Scrape, namespace: &str) -> ProberCounts {
        let label = [("shoot", namespace)];
        let count = |name: &str, labels: &[(&str, &str)]| s.value(name, labels).map(|v| v as u64);
        let attempts = |direction: &str| {
            count(
                "dwd_prober_scaling_attempts_total",
                &[("shoot", namespace), ("direction", direction)],
            )
            .unwrap_or(0)
        };
        ProberCounts {
            runs: count("dwd_prober_shoot_probe_runs_total", &label),
            fraction: s.value("dwd_prober_expired_lease_fraction", &label),
            api_failures: count("dwd_prober_api_server_probe_failures_total", &label).unwrap_or(0),
            lease_failures: count("dwd_prober_lease_probe_failures_total", &label).unwrap_or(0),
            down: attempts("Down"),
            up: attempts("Up"),
        }
    }
}

fn on_prober_scrape(journal: &Journal, config: &SandboxConfig, shoot: &mut ShootView, s: &Scrape) {
    let ProberCounts {
        runs,
        fraction,
        api_failures,
        lease_failures,
        down,
        up,
    } = ProberCounts::of(s, &shoot.namespace);
    let name = shoot.name.clone();
    journal.sample_fraction(&name, fraction);
    let disrupted_zones = update_zones(journal, shoot, s, runs);

    if api_failures > shoot.api_failures && !shoot.api_failing {
        shoot.api_failing = true;
        journal.log(
            &name,
            "prober: API server probe failed",
            Some("the shoot's API server does not answer; no lease probe and no scaling while it fails".into()),
        );
    }
    let new_runs = runs.unwrap_or(0) > shoot.probe_runs.unwrap_or(0);
    if shoot.probe_runs.is_none() && runs.is_some() {
        journal.log(
            &name,
            "prober probes the shoot: API server, then node leases",
            Some(format!(
                "every {} where Gardener's config says {}; a lease counts as expired {}s after its last renewal",
                config.probe_interval(),
                dwd_core::format_go_duration(config.prober.gardener.probe_interval),
                config.lease_validity_seconds()
            )),
        );
    } else if new_runs && shoot.api_failing && api_failures == shoot.api_failures {
        shoot.api_failing = false;
        journal.log(&name, "prober: API server probe succeeds again", None);
    }
    if lease_failures > shoot.lease_failures {
        journal.log(
            &name,
            "prober: lease probe failed",
            Some("listing nodes, machines or leases failed; no scaling this run".into()),
        );
    }
    let shoot_wide = fraction.is_some_and(|f| f >= shoot.threshold);
    if down > shoot.attempts_down && !shoot_wide && !disrupted_zones.is_empty() {
        let flow = config.zonal_flow_text();
        let why = fraction.map(|f| {
            format!(
                "zonal protection: {}, while the shoot is below its threshold ({})",
                disrupted_zones.join(", "),
                shoot.leases_text(f)
            )
        });
        journal.log(
            &name,
            format!("prober decides to scale down for the zone: {flow}"),
            why,
        );
        journal.marker(Some(&name), "zonal scale down", MarkerKind::ScaleDown);
    } else if down > shoot.attempts_down {
        let flow = config.flow_text(true);
        let why = fraction.map(|f| format!("the prober found {}", shoot.leases_text(f)));
        journal.log(&name, format!("prober decides to scale down: {flow}"), why);
        journal.marker(Some(&name), "scale down", MarkerKind::ScaleDown);
    }
    if up > shoot.attempts_up {
        let flow = config.flow_text(false);
        let why = fraction.map(|f| format!("the prober found {}", shoot.leases_text(f)));
        journal.log(&name, format!("prober decides to scale up: {flow}"), why);
        journal.marker(Some(&name), "scale up", MarkerKind::ScaleUp);
    }
    shoot.probe_runs = runs.or(shoot.probe_runs);
    if new_runs {
        shoot.fraction = fraction.or(shoot.fraction);
    }
    shoot.api_failures = api_failures;
    shoot.lease_failures = lease_failures;
    shoot.attempts_down = down;
    shoot.attempts_up = up;
}

fn on_weeder_scrape(journal: &Journal, config: &SandboxConfig, v: &mut View, s: &Scrape) {
    let active = s.value("dwd_weeder_active_weeders", &[]).map(|a| a as i64);
    if let Some(a) = active
        && v.active_weeders.unwrap_or(0) != a
    {
        let what = match a {
            0 => "weeder: no weeder active any more".to_string(),
            1 => "weeder: 1 weeder active".to_string(),
            a => format!("weeder: {a} weeders active"),
        };
        journal.log(
            "-",
            what,
            Some(format!(
                "one per EndpointSlice that turned ready, each watching that service's dependants for watchDuration {}",
                dwd_core::format_go_duration(config.watch_duration())
            )),
        );
    }
    v.active_weeders = active.or(v.active_weeders);
    v.weeder_deleted = s.sum("dwd_weeder_pods_deleted_total") as u64;
}

/// Every `K` in the cluster as it is listed, added or changed; deletions and watch errors
/// are passed over (the watcher backs off and watches again by itself).
fn applied<K>(seed: kube::Client) -> BoxStream<'static, K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + k8s_openapi::serde::de::DeserializeOwned
        + Send
        + 'static,
{
    watch(Api::<K>::all(seed), watcher::Config::default())
        .default_backoff()
        .filter_map(|event| async move {
            match event {
                Ok(Event::InitApply(o) | Event::Apply(o)) => Some(o),
                _ => None,
            }
        })
        .boxed()
}

// --- deployments --------------------------------------------------------------------------

async fn watch_deployments(
    journal: Arc<Journal>,
    config: Arc<SandboxConfig>,
    view: SharedView,
    seed: kube::Client,
    refresher: Arc<Refresher>,
) {
    let mut deployments = applied::<Deployment>(seed);
    while let Some(deployment) = deployments.next().await {
        let changed = replicas_changed(&lock(&view), &deployment);
        if changed {
            // The prober counts its decision before it scales: read it first, so the
            // timeline tells the decision before its effect.
            refresher.refresh().await;
        }
        on_deployment(&journal, &config, &mut lock(&view), &deployment);
    }
}

/// Whether `d` is a known controller whose replicas differ from what the view holds.
fn replicas_changed(v: &View, d: &Deployment) -> bool {
    let (Some(ns), Some(name)) = (&d.metadata.namespace, &d.metadata.name) else {
        return false;
    };
    let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    v.shoots
        .iter()
        .find(|s| &s.namespace == ns)
        .and_then(|s| s.replicas.get(name))
        .is_some_and(|r| *r != replicas)
}

fn on_deployment(journal: &Journal, config: &SandboxConfig, v: &mut View, d: &Deployment) {
    let (Some(ns), Some(name)) = (&d.metadata.namespace, &d.metadata.name) else {
        return;
    };
    let Some(shoot) = v.by_namespace(ns) else {
        return;
    };
    let Some(controller) = config.controller(name) else {
        return;
    };
    let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let ready = d
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    let annotations = d.metadata.annotations.clone().unwrap_or_default();
    let previous = shoot.replicas.insert(name.clone(), replicas);
    shoot.ready.insert(name.clone(), ready);
    let shoot_name = shoot.name.clone();
    match previous {
        None => journal.sample_replicas(&shoot_name, name, replicas),
        Some(from) if from != replicas => {
            journal.sample_replicas(&shoot_name, name, replicas);
            shoot.changes.push(ReplicaChange {
                t: journal.now(),
                controller: name.clone(),
                to: replicas,
            });
            let (what, why) = if replicas == 0 {
                let level = controller.down;
                let recorded = annotations
                    .get(REPLICAS_ANNOTATION)
                    .map_or(String::new(), |r| {
                        format!("; {r} recorded in annotation {REPLICAS_ANNOTATION}")
                    });
                (
                    format!("{name} scaled {from} → 0"),
                    format!("level {level} of the scale-down{recorded}"),
                )
            } else if from == 0 {
                let level = controller.up;
                let delay = if controller.up_delay.is_zero() {
                    String::new()
                } else {
                    format!(
                        ", after its initialDelay of {}, {} in Gardener's config",
                        dwd_core::format_go_duration(controller.up_delay),
                        dwd_core::format_go_duration(controller.gardener_up_delay)
                    )
                };
                (
                    format!("{name} restored 0 → {replicas}"),
                    format!("level {level} of the scale-up{delay}; the recorded replicas"),
                )
            } else {
                (
                    format!("{name} replicas {from} → {replicas}"),
                    "changed by someone else than the prober".into(),
                )
            };
            journal.log(&shoot_name, what, Some(why));
        }
        Some(_) => {}
    }
    shoot.annotations.insert(name.clone(), annotations);
}

// --- pods ---------------------------------------------------------------------------------

fn is_crashlooping(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.state
                    .as_ref()
                    .and_then(|s| s.waiting.as_ref())
                    .and_then(|w| w.reason.as_deref())
                    == Some("CrashLoopBackOff")
            })
        })
}

async fn watch_pods(
    journal: Arc<Journal>,
    view: SharedView,
    seed: kube::Client,
    refresher: Arc<Refresher>,
) {
    let api: Api<Pod> = Api::all(seed.clone());
    let config = watcher::Config::default().labels("gardener.cloud/role=controlplane");
    let mut events = watch(api, config).default_backoff().boxed();
    while let Some(event) = events.next().await {
        let (pod, state) = match event {
            Ok(Event::InitApply(p) | Event::Apply(p)) => {
                let state = if p.metadata.deletion_timestamp.is_some() {
                    PodState::Deleting
                } else {
                    PodState::Present
                };
                (p, state)
            }
            Ok(Event::Delete(p)) => (p, PodState::Gone),
            _ => continue,
        };
        if state != PodState::Present {
            // The weeder started before it deleted: narrate its start first.
            refresher.refresh().await;
        }
        let replacement = on_pod(&journal, &mut lock(&view), &pod, state);
        if let Some(r) = replacement {
            // Created off this loop so the watch keeps going.
            tokio::spawn(replace(seed.clone(), journal.clone(), view.clone(), r));
        }
    }
}

/// A pod to create in place of a deleted one.
#[derive(Debug)]
struct Replacement {
    namespace: String,
    shoot: String,
    name: String,
    labels: &'static [(&'static str, &'static str)],
    crashlooping: bool,
    /// A kube-apiserver that runs again: the kube-apiserver service turns ready with it.
    apiserver_back: bool,
}

/// Plays the ReplicaSet of a real seed: the deleted pod comes back at once, and it runs when
/// what it needs is reachable. Then plays the endpoints controller: a running kube-apiserver
/// makes its service ready again, which is what the weeder's second service waits for.
async fn replace(seed: kube::Client, journal: Arc<Journal>, view: SharedView, r: Replacement) {
    let cp = SeedControlPlane::new(seed, &r.namespace);
    if let Err(e) = cp.create_pod(&r.name, r.labels, r.crashlooping).await {
        journal.say(&format!(
            "  (could not create replacement pod {}: {e})",
            r.name
        ));
        return;
    }
    if !r.apiserver_back {
        return;
    }
    if let Err(e) = cp
        .set_endpoint_slice(
            KUBE_APISERVER_SERVICE,
            KUBE_APISERVER_ENDPOINTS,
            dwd_sim::EndpointsState::AllReady,
        )
        .await
    {
        journal.say(&format!(
            "  (could not make {KUBE_APISERVER_SERVICE} ready: {e})"
        ));
        return;
    }
    let now = journal.now();
    if let Some(s) = lock(&view).shoot_mut(&r.shoot) {
        s.kube_apiserver_ready_since = Some(now);
    }
    journal.log(
        &r.shoot,
        format!("{KUBE_APISERVER_SERVICE}: endpoints ready again"),
        Some(format!("{} runs", r.name)),
    );
}

/// Where a pod is in its life, as one watch event shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PodState {
    /// Exists.
    Present,
    /// Has a deletionTimestamp.
    Deleting,
    /// Deleted.
    Gone,
}

/// What a control-plane pod of the given `role` needs, and how its pods are made.
struct RoleInfo {
    /// The service it needs (whose return makes the weeder delete it).
    needs: &'static str,
    /// Name prefix of its pods.
    prefix: &'static str,
    labels: &'static [(&'static str, &'static str)],
}

fn role_info(role: &str) -> Option<RoleInfo> {
    match role {
        "apiserver" => Some(RoleInfo {
            needs: ETCD_SERVICE,
            prefix: "kube-apiserver",
            labels: &KUBE_APISERVER_LABELS,
        }),
        "scheduler" => Some(RoleInfo {
            needs: KUBE_APISERVER_SERVICE,
            prefix: "kube-scheduler",
            labels: &KUBE_SCHEDULER_LABELS,
        }),
        _ => None,
    }
}

/// Tells a pod's deletion: the weeder's (with why, `weeders_why`) when it was crash-looping,
/// else someone else's.
fn narrate_deletion(journal: &Journal, shoot: &str, pod: &str, weeders_why: Option<String>) {
    match weeders_why {
        Some(why) => {
            journal.log(shoot, format!("{pod} deleted by the weeder"), Some(why));
            journal.marker(Some(shoot), "weeder deletes", MarkerKind::Weeder);
        }
        None => journal.log(
            shoot,
            format!("{pod} deleted"),
            Some("it was not crash-looping: not the weeder's doing".into()),
        ),
    }
}

/// Tells the simulated ReplicaSet's replacement of a deleted pod, which crash-loops too while
/// the service it `needs` is not ready.
fn narrate_replacement(
    journal: &Journal,
    shoot: &str,
    replacement: &str,
    crashloop: bool,
    needs: &str,
) {
    journal.log(
        shoot,
        format!(
            "{replacement} replaces it{}",
            if crashloop {
                ", and crash-loops too"
            } else {
                " and runs"
            }
        ),
        Some(if crashloop {
            format!("simulated ReplicaSet; {needs} is still not ready")
        } else {
            format!("simulated ReplicaSet; {needs} is ready, so the new pod starts at once")
        }),
    );
}

/// The pod's `role` label (empty when it has none).
fn pod_role(pod: &Pod) -> String {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("role"))
        .cloned()
        .unwrap_or_default()
}

/// Updates the view; returns the replacement pod to create, if any.
fn on_pod(journal: &Journal, v: &mut View, pod: &Pod, state: PodState) -> Option<Replacement> {
    let (Some(ns), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
        return None;
    };
    let shoot = v.by_namespace(ns)?;
    let role = pod_role(pod);
    let crashlooping = is_crashlooping(pod);
    let known = shoot.pods.get(name).cloned();
    if state == PodState::Present {
        shoot.pods.insert(
            name.clone(),
            PodView {
                role,
                crashlooping,
                deleted: false,
            },
        );
        return None;
    }
    if known.as_ref().is_some_and(|p| p.deleted) {
        // Narrated when its deletionTimestamp appeared; forget it once it is gone.
        if state == PodState::Gone {
            shoot.pods.remove(name);
        }
        return None;
    }
    let was_crashlooping = crashlooping || known.as_ref().is_some_and(|p| p.crashlooping);
    let t = journal.now();
    if state == PodState::Gone {
        shoot.pods.remove(name);
    } else {
        shoot.pods.insert(
            name.clone(),
            PodView {
                role: role.clone(),
                crashlooping: was_crashlooping,
                deleted: true,
            },
        );
    }
    shoot.deleted.push((t, name.clone()));
    let shoot_name = shoot.name.clone();
    let info = role_info(&role);
    // Whether what the pod needs is there now, and since when.
    let (needed_ready, ready_since) = match info.as_ref().map(|i| i.needs) {
        Some(ETCD_SERVICE) => (shoot.etcd_ready, shoot.etcd_ready_since),
        Some(_) => (shoot.kube_apiserver_ready, shoot.kube_apiserver_ready_since),
        None => (true, None),
    };
    let weeders_why = was_crashlooping.then(|| {
        let service = info.as_ref().map_or("its service", |i| i.needs);
        match (needed_ready, ready_since) {
            (true, Some(since)) => format!(
                "CrashLoopBackOff; {service} ready again {:.1}s before",
                (t - since).max(0.0)
            ),
            _ => format!("CrashLoopBackOff; {service} is ready"),
        }
    });
    narrate_deletion(journal, &shoot_name, name, weeders_why);
    let info = info?;
    let next = shoot.next_pod.entry(role.clone()).or_insert(0);
    let replacement = format!("{}-{next}", info.prefix);
    *next += 1;
    let crashloop = !needed_ready;
    // The first kube-apiserver that runs again brings its service back (once).
    let apiserver_back = role == "apiserver" && !crashloop && !shoot.kube_apiserver_ready;
    if apiserver_back {
        shoot.kube_apiserver_ready = true;
    }
    narrate_replacement(journal, &shoot_name, &replacement, crashloop, info.needs);
    Some(Replacement {
        namespace: ns.clone(),
        shoot: shoot_name,
        name: replacement,
        labels: info.labels,
        crashlooping: crashloop,
        apiserver_back,
    })
}

// --- events -------------------------------------------------------------------------------

async fn watch_events(
    journal: Arc<Journal>,
    view: SharedView,
    seed: kube::Client,
    refresher: Arc<Refresher>,
) {
    let mut seen: HashSet<(String, i32)> = HashSet::new();
    let mut events = applied::<KubeEvent>(seed);
    while let Some(e) = events.next().await {
        let controller = e.reporting_controller.as_deref().unwrap_or_default();
        if !controller.starts_with("dependency-watchdog") {
            continue;
        }
        let regarding = e.regarding.clone().unwrap_or_default();
        let kind = regarding.kind.as_deref().unwrap_or_default();
        let warning = e.type_.as_deref() == Some("Warning");
        if kind != "Cluster" && !warning {
            // Per-target and per-pod events repeat what the timeline already says.
            continue;
        }
        let count = e.series.as_ref().map_or(1, |s| s.count);
        let uid = e.metadata.uid.clone().unwrap_or_default();
        if !seen.insert((uid, count)) {
            continue;
        }
        let namespace = if kind == "Cluster" {
            regarding.name.clone().unwrap_or_default()
        } else {
            regarding
                .namespace
                .clone()
                .or(e.metadata.namespace.clone())
                .unwrap_or_default()
        };
        let shoot = lock(&view)
            .by_namespace(&namespace)
            .map(|s| s.name.clone())
            .unwrap_or_else(|| "-".into());
        // The event follows the decision it reports: narrate the decision first.
        refresher.refresh().await;
        let reason = e.reason.as_deref().unwrap_or("?");
        let object = match &regarding.name {
            Some(n) if kind != "Cluster" => format!("{kind} {n}"),
            _ => kind.to_string(),
        };
        let note = e.note.as_deref().unwrap_or("");
        journal.log(
            &shoot,
            format!(
                "{} Event {reason} on the {object}: \"{note}\"",
                if warning { "Warning" } else { "Kubernetes" }
            ),
            None,
        );
    }
}
