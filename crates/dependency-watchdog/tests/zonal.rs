//! Zonal outages (docs/behaviour.md §2.19) against real apiservers: shoots whose nodes carry
//! `topology.kubernetes.io/zone`, one zone's kubelets silenced at a time.
//!
//! The config is Gardener's (`deploy/gardener/prober.yaml`) with its intervals shortened as
//! `tests/gardener.rs` shortens them: MCM and CA scale down at level 0, KCM at level 1; KCM
//! comes up at level 0, MCM at level 1 (after its `initialDelay`), CA at level 2.
//!
//! - *Protected*: Gardener's config plus zonal protection for MCM and CA
//!   (`scaleDownOnZoneOutage: true`), a zone disrupted only when every candidate lease of it
//!   expired (`zoneLeaseFailureFraction: 1.0`) and it has at least 3 candidates
//!   (`minCandidatesPerZone: 3`). One in-process prober against the shared seed.
//! - *Unprotected*: Gardener's config with nothing added, so zones are reported, never acted
//!   on. Its own in-process prober against a second seed apiserver (a prober probes every
//!   Cluster of its seed, and one seed can't carry two probers).
//!
//! Both share one shoot apiserver; every test makes its own shoot namespace and node names.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod harness;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};

use dependency_watchdog::metrics::Metrics;
use dependency_watchdog::observe::events::{
    REASON_SCALE_DOWN, REASON_ZONE_DISRUPTED, REASON_ZONE_RECOVERED,
};
use dependency_watchdog::observe::health::Health;
use dwd_core::scaling::{MELTDOWN_ANNOTATION, REPLICAS_ANNOTATION};
use dwd_sim::{NodeSpec, SimShoot, SimShootOptions};
use dwd_testenv::{ApiServer, ApiServerOptions, TestEnv, eventually};
use harness::in_process::{
    CA, DEADLINE, KCM, MCM, RENEW, assert_level_order, assert_recorded, assert_untouched,
    deployment_state, logged, position_from, record_replica_changes, wait_annotations_cleared,
    wait_replicas,
};
use k8s_openapi::api::events::v1::Event;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// Gardener's MCM scale-up `initialDelay` (30 s), shortened as `tests/gardener.rs` does.
const MCM_UP_DELAY: &str = "3s";
/// What a zonal note says protection does with Gardener's zonal targets.
const ZONAL_CONSEQUENCE: &str =
    "zonal protection scales down machine-controller-manager, cluster-autoscaler";

// --- the configs ----------------------------------------------------------------------------

/// `dep-config.yaml` of the ConfigMap in `deploy/gardener/prober.yaml`, as gardenlet writes it.
fn gardener_config() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/gardener/prober.yaml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text)
        .unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()));
    let configs: Vec<&str> = docs
        .iter()
        .filter(|d| d["kind"] == "ConfigMap")
        .filter_map(|d| d["data"]["dep-config.yaml"].as_str())
        .collect();
    assert_eq!(configs.len(), 1, "one prober config in {}", path.display());
    configs[0].to_string()
}

/// `text` with `from` replaced by `to`, which must occur exactly once.
fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(
        text.matches(from).count(),
        1,
        "Gardener's config changed shape ({from:?}):\n{text}"
    );
    text.replacen(from, to, 1)
}

/// Gardener's config with only its intervals shortened (as `tests/gardener.rs` shortens them):
/// a probe every second, nodes gone 3 s after their last renewal (grace 4 s), MCM restored
/// 3 s into a scale-up.
fn shortened() -> String {
    let config = replace_once(
        &gardener_config(),
        "probeInterval: 30s\n",
        "probeInterval: 1s\ninitialDelay: 1s\nprobeTimeout: 5s\nkcmNodeMonitorGraceDuration: 4s\n",
    );
    replace_once(
        &config,
        "initialDelay: 30s\n",
        &format!("initialDelay: {MCM_UP_DELAY}\n"),
    )
}

/// [`shortened`] plus zonal protection for MCM and CA: a zone counts as disrupted when all of
/// its candidate leases expired and it has at least 3 candidates.
fn protected_config() -> String {
    let mut config = shortened();
    for target in [MCM, CA] {
        let name = format!("    name: {target}\n");
        config = replace_once(
            &config,
            &name,
            &format!("{name}  scaleDownOnZoneOutage: true\n"),
        );
    }
    config + "zoneLeaseFailureFraction: 1.0\nminCandidatesPerZone: 3\n"
}

fn parse(text: &str) -> dwd_core::ProberConfig {
    dwd_core::ProberConfig::from_yaml(text)
        .unwrap_or_else(|e| panic!("config: {e}\n{text}"))
        .config
}

// --- the probers ----------------------------------------------------------------------------

/// One in-process prober on a seed of its own.
struct Prober {
    seed: ApiServer,
    config_text: String,
    config: dwd_core::ProberConfig,
    registry: Arc<Mutex<Registry>>,
    health: Arc<Health>,
}

/// Starts a prober with `config_text` against `seed` on a runtime of its own (it outlives every
/// test's runtime).
fn start_prober(seed: ApiServer, config_text: String) -> Prober {
    let config = parse(&config_text);
    let metrics = Arc::new(Metrics::default());
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let health = Arc::new(Health::default());
    let (kubeconfig, run_config, h) = (
        seed.kubeconfig().to_string(),
        config.clone(),
        health.clone(),
    );
    harness::in_process::spawn_prober(
        kubeconfig,
        run_config,
        metrics.clone(),
        h,
        "dwd-prober-test",
        CancellationToken::new(),
    );
    Prober {
        seed,
        config_text,
        config,
        registry: Arc::new(Mutex::new(registry)),
        health,
    }
}

/// The shared environment and its shoot apiserver.
async fn env() -> (&'static TestEnv, &'static ApiServer) {
    static SHOOTS: tokio::sync::OnceCell<ApiServer> = tokio::sync::OnceCell::const_new();
    harness::in_process::init_tracing();
    let env = TestEnv::shared().await.expect("test environment");
    let shoots = SHOOTS
        .get_or_init(|| async {
            env.start_apiserver("zonal-shoots")
                .await
                .expect("shoot apiserver")
        })
        .await;
    (env, shoots)
}

/// The prober with zonal protection, on the shared seed.
async fn protected() -> &'static Prober {
    static PROBER: tokio::sync::OnceCell<Prober> = tokio::sync::OnceCell::const_new();
    let (env, _) = env().await;
    let p = PROBER
        .get_or_init(|| async {
            let seed = env.apiserver("seed").expect("seed apiserver");
            start_prober(seed, protected_config())
        })
        .await;
    p.wait_ready().await;
    p
}

/// The prober with Gardener's config unchanged, on a seed of its own.
async fn unprotected() -> &'static Prober {
    static PROBER: tokio::sync::OnceCell<Prober> = tokio::sync::OnceCell::const_new();
    let (env, _) = env().await;
    let p = PROBER
        .get_or_init(|| async {
            let seed = env
                .start_apiserver_with("zonal-off-seed", ApiServerOptions::seed())
                .await
                .expect("second seed apiserver");
            start_prober(seed, shortened())
        })
        .await;
    p.wait_ready().await;
    p
}

impl Prober {
    async fn wait_ready(&self) {
        harness::in_process::wait_ready(&self.health).await;
    }

    async fn client(&self) -> kube::Client {
        self.seed.client().await.expect("seed client")
    }

    /// Creates shoot `shoot--zonal--<name>` on this prober's seed with `(zone, nodes)` nodes
    /// (named `<name>-<zone>-<i>`, unique on the shared shoot apiserver) and KCM 3, MCM 2,
    /// CA 2 replicas.
    async fn zoned_shoot(&self, name: &str, zones: &[(&str, usize)]) -> SimShoot {
        let (_, shoots) = env().await;
        let mut options =
            SimShootOptions::new(format!("shoot--zonal--{name}")).with_renew_interval(RENEW);
        options.node_specs = Some(
            zones
                .iter()
                .flat_map(|&(zone, n)| {
                    (0..n).map(move |i| {
                        NodeSpec::new(format!("{name}-{zone}-{i}"), "worker-a").in_zone(zone)
                    })
                })
                .collect(),
        );
        options.deployments = vec![(KCM.into(), 3), (MCM.into(), 2), (CA.into(), 2)];
        SimShoot::create(
            self.client().await,
            shoots.client().await.expect("shoot client"),
            shoots.kubeconfig(),
            options,
        )
        .await
        .expect("simulated shoot")
    }

    fn metrics_text(&self) -> String {
        harness::in_process::metrics_text_of(&self.registry)
    }

    /// Value of the series `metric` whose labels are exactly `labels` (`k="v",…`).
    fn metric(&self, metric: &str, labels: &str) -> Option<f64> {
        let prefix = format!("{metric}{{{labels}}} ");
        self.metrics_text()
            .lines()
            .find_map(|l| l.strip_prefix(&prefix).map(str::to_string))
            .and_then(|v| v.trim().parse().ok())
    }

    fn zone_metric(&self, metric: &str, ns: &str, zone: &str) -> Option<f64> {
        self.metric(metric, &format!("shoot=\"{ns}\",zone=\"{zone}\""))
    }

    fn runs(&self, ns: &str) -> u64 {
        self.metric(
            "dwd_prober_shoot_probe_runs_total",
            &format!("shoot=\"{ns}\""),
        )
        .unwrap_or(0.0) as u64
    }

    /// Waits until the shoot's probe has run `more` more times.
    async fn wait_runs(&self, ns: &str, more: u64) {
        let target = self.runs(ns) + more;
        eventually(
            DEADLINE,
            &format!("{more} more probe runs of {ns}"),
            || async move { Ok((self.runs(ns) >= target).then_some(())) },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\nmetrics:\n{}", self.metrics_text()));
    }

    /// Waits until `dwd_prober_zone_<metric>` of `zone` is `want`.
    async fn wait_zone_metric(&self, metric: &str, ns: &str, zone: &str, want: f64) {
        let metric = format!("dwd_prober_zone_{metric}");
        eventually(
            DEADLINE,
            &format!("{metric} of {ns} zone {zone} = {want}"),
            || {
                let got = self.zone_metric(&metric, ns, zone);
                async move {
                    match got {
                        Some(v) if v == want => Ok(Some(())),
                        other => Err(format!("seen {other:?}")),
                    }
                }
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\nmetrics:\n{}", self.metrics_text()));
    }
}

// --- reading what the prober did ------------------------------------------------------------

/// `events.k8s.io` events about Cluster `ns` (cluster-scoped: they live in `default`) with
/// `reason`, oldest first.
async fn cluster_events(seed: &kube::Client, ns: &str, reason: &str) -> Vec<Event> {
    harness::in_process::events_about(seed, "default", "Cluster", ns, reason).await
}

/// Waits for an event about Cluster `ns` with `reason` whose note passes `accept`.
async fn wait_cluster_event(
    seed: &kube::Client,
    ns: &str,
    reason: &str,
    accept: impl Fn(&str) -> bool,
) -> Event {
    let accept = &accept;
    eventually(
        DEADLINE,
        &format!("a {reason} event on Cluster {ns}"),
        || async move {
            let found = cluster_events(seed, ns, reason).await;
            let notes: Vec<String> = found.iter().map(|e| note(e).to_string()).collect();
            match found.into_iter().find(|e| accept(note(e))) {
                Some(e) => Ok(Some(e)),
                None => Err(format!("notes so far: {notes:?}")),
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

fn note(e: &Event) -> &str {
    e.note.as_deref().unwrap_or_default()
}

/// The nodes of `zone` (named `<name>-<zone>-<i>` by [`Prober::zoned_shoot`]).
fn nodes_of(shoot: &SimShoot, zone: &str) -> Vec<String> {
    let nodes: Vec<String> = shoot
        .nodes()
        .iter()
        .filter(|n| n.labels.get(dwd_sim::ZONE_LABEL).map(String::as_str) == Some(zone))
        .map(|n| n.name.clone())
        .collect();
    assert!(!nodes.is_empty(), "no node in zone {zone}");
    nodes
}

fn silence_zone(shoot: &SimShoot, zone: &str) {
    let nodes = nodes_of(shoot, zone);
    let names: Vec<&str> = nodes.iter().map(String::as_str).collect();
    shoot.kubelets().silence(&names);
}

/// Runs the real binary's `explain` for `ns` with `config_text`; its stdout.
fn explain_binary(p: &Prober, ns: &str, output: &str) -> String {
    let dir = std::env::temp_dir().join(format!("dwd-zonal-explain-{}-{ns}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let config_path = dir.join("dep-config.yaml");
    std::fs::write(&config_path, &p.config_text).expect("config");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dependency-watchdog"))
        .args([
            "explain",
            "--output",
            output,
            "--namespace",
            ns,
            "--config-file",
        ])
        .arg(&config_path)
        .arg("--kubeconfig")
        .arg(p.seed.kubeconfig_path())
        .output()
        .expect("run explain");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "explain failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// The line of `zone` in explain's text `zones` section.
fn zone_line<'a>(text: &'a str, zone: &str) -> &'a str {
    let (_, zones) = text
        .split_once("  zones (")
        .unwrap_or_else(|| panic!("no zones section:\n{text}"));
    zones
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("    "))
        .find(|l| l.split_whitespace().next() == Some(zone))
        .unwrap_or_else(|| panic!("no line for zone {zone}:\n{text}"))
}

/// explain, during zone a's outage: zone a DISRUPTED, the decision zonal, the flow only MCM and
/// CA. In-process (its structure) and the real binary (its text).
async fn assert_explain_shows_zone_a_disrupted(p: &Prober, seed: &kube::Client, ns: &str) {
    let explanation = dependency_watchdog::explain::explain(seed, &p.config, ns)
        .await
        .expect("explain");
    let lp = explanation
        .lease_probe
        .as_ref()
        .unwrap_or_else(|| panic!("the lease probe ran: {explanation}"));
    let zones: Vec<(&str, usize, usize, bool)> = lp
        .zones
        .iter()
        .map(|z| (z.zone.as_str(), z.candidates, z.expired, z.disrupted))
        .collect();
    assert_eq!(
        zones,
        [("a", 3, 3, true), ("b", 3, 0, false), ("c", 3, 0, false)],
        "{explanation}"
    );
    assert!(lp.zonal_protection, "{explanation}");
    assert_eq!(lp.decision, "scale down the zonal targets", "{explanation}");
    let flow: BTreeSet<&str> = explanation
        .flow
        .iter()
        .flat_map(|l| &l.targets)
        .map(|t| t.target.as_str())
        .collect();
    assert_eq!(
        flow,
        BTreeSet::from([
            "Deployment/machine-controller-manager",
            "Deployment/cluster-autoscaler"
        ]),
        "{explanation}"
    );
    let text = explain_binary(p, ns, "text");
    let line = zone_line(&text, "a");
    assert!(
        line.contains("3/3 expired") && line.ends_with("DISRUPTED"),
        "{line:?}\n{text}"
    );
    for zone in ["b", "c"] {
        let line = zone_line(&text, zone);
        assert!(line.ends_with(": ok"), "{line:?}\n{text}");
    }
    assert!(text.contains("zonal protection on"), "{text}");
}

// --- the scenarios --------------------------------------------------------------------------

#[tokio::test]
async fn a_lost_zone_scales_down_only_the_zonal_targets_and_its_recovery_restores_them() {
    let p = protected().await;
    let seed = p.client().await;
    let shoot = p.zoned_shoot("lost", &[("a", 3), ("b", 3), ("c", 3)]).await;
    let ns = shoot.namespace().to_string();
    p.wait_runs(&ns, 2).await;
    let (log, watch) = record_replica_changes(seed.clone(), &ns);

    // Zone a loses its way to the control plane: 3/9 leases expire, far below the shoot-wide
    // 0.6, but the whole zone is gone. MCM and CA (both at scale-down level 0) go down.
    silence_zone(&shoot, "a");
    wait_replicas(&seed, &ns, &[(MCM, 0), (CA, 0)]).await;
    let scaled_down = {
        let log = logged(&log, &[(MCM, 0), (CA, 0)], 0).await;
        position_from(&log, MCM, 0, 0).max(position_from(&log, CA, 0, 0)) + 1
    };
    assert_recorded(&seed, &ns, &[(MCM, "2"), (CA, "2")]).await;

    // The disruption is a Warning on the Cluster naming the zone and what was done.
    let disrupted = wait_cluster_event(&seed, &ns, REASON_ZONE_DISRUPTED, |_| true).await;
    assert_eq!(
        note(&disrupted),
        format!("zone a: 3/3 node leases expired; {ZONAL_CONSEQUENCE}"),
        "{disrupted:?}"
    );
    assert_eq!(disrupted.type_.as_deref(), Some("Warning"), "{disrupted:?}");
    p.wait_zone_metric("disrupted", &ns, "a", 1.0).await;
    p.wait_zone_metric("expired_lease_fraction", &ns, "a", 1.0)
        .await;
    for zone in ["b", "c"] {
        assert_eq!(
            p.zone_metric("dwd_prober_zone_disrupted", &ns, zone),
            Some(0.0),
            "zone {zone}"
        );
    }

    assert_explain_shows_zone_a_disrupted(p, &seed, &ns).await;

    // KCM keeps its replicas through further runs of the outage.
    p.wait_runs(&ns, 3).await;
    let (kcm, a) = deployment_state(&seed, &ns, KCM).await;
    assert_eq!(kcm, 3, "KCM: {a:?}");
    assert!(
        !a.contains_key(REPLICAS_ANNOTATION) && !a.contains_key(MELTDOWN_ANNOTATION),
        "KCM: {a:?}"
    );

    // Zone a comes back: MCM (scale-up level 1, after its initial delay) before CA (level 2),
    // both to their recorded replicas; KCM never changed.
    shoot.kubelets().resume_all();
    wait_replicas(&seed, &ns, &[(KCM, 3), (MCM, 2), (CA, 2)]).await;
    {
        assert_level_order(
            &log,
            &[&[(MCM, 2)], &[(CA, 2)]],
            scaled_down,
            "scale-up: MCM (1) before CA (2)",
        )
        .await;
        let log = log.lock().expect("log").clone();
        assert!(
            log.iter().all(|(n, r)| n != KCM || *r == 3),
            "KCM must never be scaled: {log:?}"
        );
    }
    wait_annotations_cleared(&seed, &ns, &[KCM, MCM, CA]).await;
    let recovered = wait_cluster_event(&seed, &ns, REASON_ZONE_RECOVERED, |_| true).await;
    assert!(
        note(&recovered).starts_with("zone a recovered: "),
        "{recovered:?}"
    );
    assert_eq!(recovered.type_.as_deref(), Some("Normal"), "{recovered:?}");
    p.wait_zone_metric("disrupted", &ns, "a", 0.0).await;
    watch.abort();
}

#[tokio::test]
async fn without_zonal_protection_a_lost_zone_is_reported_and_nothing_is_scaled() {
    let p = unprotected().await;
    assert!(!p.config.zone_rule().protection, "Gardener's config: off");
    let seed = p.client().await;
    let shoot = p.zoned_shoot("off", &[("a", 3), ("b", 3), ("c", 3)]).await;
    let ns = shoot.namespace().to_string();
    p.wait_runs(&ns, 2).await;

    silence_zone(&shoot, "a");
    // Gardener's config sets no zone threshold: the zone is disrupted at the shoot's 0.6, so
    // at 2/3 or 3/3, whichever a run saw first.
    let disrupted = wait_cluster_event(&seed, &ns, REASON_ZONE_DISRUPTED, |n| {
        n.ends_with("; zonal protection is not configured")
    })
    .await;
    let text = note(&disrupted);
    assert!(
        text.starts_with("zone a: 2/3 node leases expired;")
            || text.starts_with("zone a: 3/3 node leases expired;"),
        "{disrupted:?}"
    );
    assert_eq!(disrupted.type_.as_deref(), Some("Warning"), "{disrupted:?}");
    p.wait_zone_metric("expired_lease_fraction", &ns, "a", 1.0)
        .await;
    assert_eq!(
        p.zone_metric("dwd_prober_zone_disrupted", &ns, "a"),
        Some(1.0)
    );

    // Several more runs with the whole zone gone: today's behaviour, nothing scaled.
    p.wait_runs(&ns, 5).await;
    assert_untouched(&seed, &ns, "zone a lost, protection off").await;
    assert!(
        cluster_events(&seed, &ns, REASON_SCALE_DOWN)
            .await
            .is_empty(),
        "no scale-down decision without zonal protection"
    );
    let disruptions = cluster_events(&seed, &ns, REASON_ZONE_DISRUPTED).await;
    assert_eq!(
        disruptions.len(),
        1,
        "one event per disruption, not per run: {disruptions:?}"
    );

    shoot.kubelets().resume_all();
    wait_cluster_event(&seed, &ns, REASON_ZONE_RECOVERED, |n| {
        n.starts_with("zone a recovered: ")
    })
    .await;
    p.wait_zone_metric("disrupted", &ns, "a", 0.0).await;
    assert_untouched(&seed, &ns, "zone a back").await;
}

#[tokio::test]
async fn two_lost_zones_of_three_are_the_shoot_wide_rule_and_kcm_goes_down_too() {
    let p = protected().await;
    let seed = p.client().await;
    let shoot = p.zoned_shoot("two", &[("a", 3), ("b", 3), ("c", 3)]).await;
    let ns = shoot.namespace().to_string();
    p.wait_runs(&ns, 2).await;
    let (log, watch) = record_replica_changes(seed.clone(), &ns);

    // 6/9 leases expire: the shoot-wide rule (0.6) scales everything down, KCM (level 1)
    // after MCM and CA (level 0).
    silence_zone(&shoot, "a");
    silence_zone(&shoot, "b");
    wait_replicas(&seed, &ns, &[(KCM, 0), (MCM, 0), (CA, 0)]).await;
    let scaled_down = assert_level_order(
        &log,
        &[&[(MCM, 0), (CA, 0)], &[(KCM, 0)]],
        0,
        "scale-down: MCM and CA (0) before KCM (1)",
    )
    .await;
    assert_recorded(&seed, &ns, &[(KCM, "3"), (MCM, "2"), (CA, "2")]).await;
    // The shoot-wide decision named KCM (a zonal run before it, while zone b's leases were
    // still expiring, may have taken MCM and CA already).
    wait_cluster_event(&seed, &ns, REASON_SCALE_DOWN, |n| n.contains(KCM)).await;
    p.wait_zone_metric("disrupted", &ns, "a", 1.0).await;
    p.wait_zone_metric("disrupted", &ns, "b", 1.0).await;
    assert_eq!(
        p.zone_metric("dwd_prober_zone_disrupted", &ns, "c"),
        Some(0.0)
    );

    // Both zones back: everything restored, KCM (0) first, then MCM (1), then CA (2).
    shoot.kubelets().resume_all();
    wait_replicas(&seed, &ns, &[(KCM, 3), (MCM, 2), (CA, 2)]).await;
    assert_level_order(
        &log,
        &[&[(KCM, 3)], &[(MCM, 2)], &[(CA, 2)]],
        scaled_down,
        "scale-up: KCM (0), MCM (1), CA (2)",
    )
    .await;
    wait_annotations_cleared(&seed, &ns, &[KCM, MCM, CA]).await;
    watch.abort();
}

#[tokio::test]
async fn a_zone_with_too_few_candidates_never_counts() {
    let p = protected().await;
    let seed = p.client().await;
    // Zone a has 2 nodes, fewer than minCandidatesPerZone (3).
    let shoot = p
        .zoned_shoot("small", &[("a", 2), ("b", 3), ("c", 3)])
        .await;
    let ns = shoot.namespace().to_string();
    p.wait_runs(&ns, 2).await;

    silence_zone(&shoot, "a");
    // Every lease of zone a seen expired (2/8 shoot-wide, far below 0.6), then more runs.
    p.wait_zone_metric("expired_lease_fraction", &ns, "a", 1.0)
        .await;
    p.wait_runs(&ns, 5).await;
    assert_untouched(&seed, &ns, "a too small zone lost").await;
    assert_eq!(
        p.zone_metric("dwd_prober_zone_disrupted", &ns, "a"),
        Some(0.0),
        "{}",
        p.metrics_text()
    );
    assert!(
        cluster_events(&seed, &ns, REASON_ZONE_DISRUPTED)
            .await
            .is_empty(),
        "a zone below the minimum is never disrupted"
    );

    // explain says why: zone a has too few candidates to judge.
    let json: serde_json::Value =
        serde_json::from_str(&explain_binary(p, &ns, "json")).expect("explain JSON");
    let lp = &json["lease_probe"];
    assert_eq!(lp["min_candidates_per_zone"], 3, "{json:#}");
    let a = lp["zones"]
        .as_array()
        .and_then(|zones| zones.iter().find(|z| z["zone"] == "a"))
        .unwrap_or_else(|| panic!("zone a in explain: {json:#}"));
    assert_eq!(
        (
            &a["candidates"],
            &a["expired"],
            &a["too_small"],
            &a["disrupted"]
        ),
        (
            &serde_json::json!(2),
            &serde_json::json!(2),
            &serde_json::json!(true),
            &serde_json::json!(false)
        ),
        "{json:#}"
    );
    assert_eq!(lp["decision"], "scale up", "{json:#}");
    let text = explain_binary(p, &ns, "text");
    let line = zone_line(&text, "a");
    assert!(
        line.contains("2/2 expired") && line.ends_with("too few candidates to judge"),
        "{line:?}\n{text}"
    );
}
