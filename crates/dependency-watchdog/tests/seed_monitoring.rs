//! The monitoring a stock Gardener seed lacks for the watchdog (`deploy/gardener/monitoring.yaml`
//! and `monitoring-dashboard.yaml`), checked against what Gardener's seed monitoring selects and
//! against a real kube-apiserver serving the prometheus-operator CRDs that gardenlet installs.
//!
//! Gardener's side is read from gardener/gardener at commit
//! b312835d1784c3628983205c05452b2eaa95b645 (the commit `deploy/gardener/` is reproduced from) and
//! stated as the constants below, each with the file it comes from.
//!
//! - [`monitoring_files_fit_gardeners_seed_monitoring`], from the files: for each role, the
//!   Service selects the pods of gardenlet's Deployment (`deploy/gardener/<role>.yaml`) on the
//!   port their container declares, carries the resource manager's annotation that lets the
//!   seed Prometheus through `garden`'s `deny-all`, and its ServiceMonitor, labelled for the seed
//!   Prometheus only, selects that Service (job = the Service's name). The PrometheusRule has
//!   `deploy/prober/prometheusrule.yaml`'s rules, labelled for the seed Prometheus' ruleSelector,
//!   on metrics the binary exports. The dashboard ConfigMap is `deploy/grafana`'s dashboard as
//!   Plutono reads it ([`plutono_dashboard`]), labelled for the seed Plutono, defaulting to its
//!   `prometheus-seed` data source, on metrics the binary exports, every family that other
//!   jobs of the seed Prometheus export too restricted to the watchdog's jobs.
//! - [`seed_apiserver_accepts_and_selects_the_monitoring_objects`], on a kube-apiserver with
//!   the ServiceMonitor and PrometheusRule CRDs: every shipped object is applied with field
//!   validation `Strict` (which is shown to refuse an unknown field and a malformed duration
//!   first); gardenlet's pods, created from its Deployments' templates, are what each Service
//!   selects; each ServiceMonitor selects its Service; the seed Prometheus' selectors (and not
//!   the `cache` or `aggregate` Prometheus') select the ServiceMonitors and the PrometheusRule,
//!   and the seed Plutono's selects the dashboard.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod harness;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use dwd_testenv::{TestEnv, eventually};
use harness::gardener::{GARDEN, Gardener, apply, ensure_namespace, fixture, fixture_path, one};
use harness::monitoring::{
    check_dashboard, check_prometheus_rule, exported_metrics_text, exported_sample_names,
    grafana_dashboard, metric_names_in, prometheus_duration_ms,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Service};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{GroupVersionKind, Selector, SelectorExt};
use serde_json::{Value, json};

// --- Gardener's seed monitoring (gardener/gardener b312835d17) ------------------------------

/// The label key by which every Prometheus gardenlet deploys selects ServiceMonitors,
/// PodMonitors and PrometheusRules, in every namespace: `monitoringutils.Labels(name)`
/// (pkg/component/observability/monitoring/utils/utils.go `Labels`;
/// pkg/component/observability/monitoring/prometheus/prometheus.go `ServiceMonitorSelector`,
/// `RuleSelector`, and their namespace selectors `{}`).
const PROMETHEUS_LABEL: &str = "prometheus";
/// The seed Prometheus' name, the value of [`PROMETHEUS_LABEL`] it selects
/// (pkg/gardenlet/controller/seed/seed/components.go `newSeedPrometheus`;
/// prometheus/seed/constants.go `Label`).
const SEED_PROMETHEUS: &str = "seed";
/// The seed's other Prometheis (components.go `newCachePrometheus`, `newAggregatePrometheus`):
/// they must not scrape the watchdog or evaluate its rules as well.
const OTHER_SEED_PROMETHEI: &[&str] = &["cache", "aggregate"];
/// The seed Prometheus' pod label that lets it reach scrape targets through `garden`'s
/// `deny-all` NetworkPolicy: `networking.resources.gardener.cloud/to-` +
/// `LabelNetworkPolicySeedScrapeTargets` (components.go `newSeedPrometheus`, AdditionalPodLabels;
/// pkg/apis/core/v1beta1/constants/types_constants.go; the `deny-all` policy:
/// pkg/controller/networkpolicy/reconciler.go).
const SEED_PROMETHEUS_POD_LABEL: &str =
    "networking.resources.gardener.cloud/to-all-seed-scrape-targets";
/// gardener-resource-manager's NetworkPolicy controller: a Service annotated
/// `<FROM_POLICY_PREFIX><alias><FROM_POLICY_SUFFIX>` with a list of ports gets the policies that
/// let pods labelled `<TO_POLICY_PREFIX><alias>: allowed` reach those ports of the Service's
/// pods (pkg/apis/resources/v1alpha1/types.go `NetworkPolicyFromPolicyAnnotationPrefix`,
/// `NetworkPolicyFromPolicyAnnotationSuffix`, `NetworkPolicyLabelKeyPrefix`;
/// pkg/resourcemanager/controller/networkpolicy/reconciler.go).
const FROM_POLICY_PREFIX: &str = "networking.resources.gardener.cloud/from-";
const FROM_POLICY_SUFFIX: &str = "-allowed-ports";
const TO_POLICY_PREFIX: &str = "networking.resources.gardener.cloud/to-";
/// The label by which the seed's Plutono loads dashboards: its `dashboard-refresher` sidecar
/// watches the ConfigMaps of its own namespace (`garden`) labelled
/// `dashboard.monitoring.gardener.cloud/seed: "true"` (pkg/component/observability/plutono/
/// plutono.go `dashboardLabel`, `labelValueTrue`, `refresherSidecar`; types_constants.go
/// `LabelPrefixMonitoringDashboard`).
const SEED_DASHBOARD_LABEL: &str = "dashboard.monitoring.gardener.cloud/seed";
/// The seed Plutono's data source of the seed Prometheus (plutono.go `getDataSource`). Its
/// default data source, `prometheus-aggregate`, has none of the watchdog's metrics.
const SEED_PROMETHEUS_DATASOURCE: &str = "prometheus-seed";
/// Plutono is Grafana 7.5 (gardener's imagevector/containers.yaml: plutono v7.5.50): this is
/// its dashboard schema version, and it names data sources by name, where Grafana 8.3 and later
/// write `{"type", "uid"}` references.
const PLUTONO_SCHEMA_VERSION: u64 = 27;
/// The PriorityClass of gardenlet's watchdog pods (pkg/component/nodemanagement/
/// dependencywatchdog/bootstrap.go) and its value (pkg/component/seed/system/system.go).
const PRIORITY_CLASS: &str = "gardener-system-800";
const PRIORITY: i32 = 999_998_800;

// --- the shipped files ----------------------------------------------------------------------

const ROLES: &[&str] = &["prober", "weeder"];
const MONITORING: &str = "monitoring.yaml";
const DASHBOARD: &str = "monitoring-dashboard.yaml";
/// The dashboard ConfigMap's name and its one key.
const DASHBOARD_CONFIG_MAP: &str = "dependency-watchdog-plutono-dashboard";
const DASHBOARD_KEY: &str = "dependency-watchdog.json";
/// The prometheus-operator CRDs gardenlet installs (tests/corpus/prometheus-operator/README.md).
const CRDS: &[&str] = &[
    "monitoring.coreos.com_servicemonitors.yaml",
    "monitoring.coreos.com_prometheusrules.yaml",
];
/// The longest scrape interval at which the alerts' 2-minute windows still hold more than two
/// samples.
const MAX_SCRAPE_INTERVAL_MS: u64 = 30_000;
/// Deadline for the API server to serve the CRDs.
const DEADLINE: Duration = Duration::from_secs(60);
const FIELD_MANAGER: &str = "dwd-seed-monitoring-test";

/// One role's objects: gardenlet's Deployment and, from monitoring.yaml, the Service and the
/// ServiceMonitor that scrape it.
struct Scrape {
    role: &'static str,
    deployment: Deployment,
    service: Service,
    monitor: Value,
}

impl Scrape {
    /// `role`'s Service (named as its Deployment) and the one ServiceMonitor that selects it.
    fn load(role: &'static str, monitoring: &BTreeMap<String, Vec<Value>>) -> Result<Scrape> {
        let deployment: Deployment = one(&Gardener::load(role)?.docs, "Deployment")?;
        let name = deployment.name_any();
        let service: Service = monitoring
            .get("Service")
            .into_iter()
            .flatten()
            .find(|s| s["metadata"]["name"] == name.as_str())
            .with_context(|| format!("{MONITORING}: no Service {name}"))
            .and_then(|s| Ok(serde_json::from_value(s.clone())?))?;
        let service_labels = service.labels().clone();
        let monitors: Vec<&Value> = monitoring
            .get("ServiceMonitor")
            .into_iter()
            .flatten()
            .filter(|m| selector(&m["spec"]["selector"]).is_ok_and(|s| s.matches(&service_labels)))
            .collect();
        ensure!(
            monitors.len() == 1,
            "{MONITORING}: {} ServiceMonitors select Service {name} (labels {service_labels:?}), want 1",
            monitors.len()
        );
        Ok(Scrape {
            role,
            deployment,
            service,
            monitor: monitors[0].clone(),
        })
    }

    /// The labels of gardenlet's pods.
    fn pod_labels(&self) -> BTreeMap<String, String> {
        self.deployment
            .spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.labels.clone())
            .unwrap_or_default()
    }

    /// gardenlet's container (the pod has one).
    fn container(&self) -> Result<&Container> {
        let containers = &self
            .deployment
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .context("Deployment without pod spec")?
            .containers;
        ensure!(containers.len() == 1, "{} containers", containers.len());
        Ok(&containers[0])
    }

    /// A pod as gardenlet's Deployment creates it.
    fn pod(&self) -> Result<Pod> {
        let template = self
            .deployment
            .spec
            .clone()
            .context("Deployment without spec")?
            .template;
        Ok(Pod {
            metadata: ObjectMeta {
                name: Some(format!("{}-0", self.deployment.name_any())),
                namespace: Some(GARDEN.into()),
                labels: Some(self.pod_labels()),
                ..Default::default()
            },
            spec: template.spec,
            status: None,
        })
    }
}

/// A label selector (`matchLabels`, `matchExpressions`) of a document.
fn selector(v: &Value) -> Result<Selector> {
    let s: LabelSelector =
        serde_json::from_value(v.clone()).with_context(|| format!("no label selector: {v}"))?;
    Selector::try_from(s).map_err(|e| anyhow!("label selector {v}: {e}"))
}

/// The Prometheis of the seed (by name) whose selectors select an object labelled `labels`.
fn prometheus_selects(labels: &BTreeMap<String, String>) -> Vec<&'static str> {
    std::iter::once(SEED_PROMETHEUS)
        .chain(OTHER_SEED_PROMETHEI.iter().copied())
        .filter(|p| labels.get(PROMETHEUS_LABEL).map(String::as_str) == Some(p))
        .collect()
}

/// The labels of a document.
fn labels_of(doc: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(doc["metadata"]["labels"].clone()).unwrap_or_default()
}

/// The Service selects gardenlet's pods on their container's metrics port and lets the seed
/// Prometheus reach it; the ServiceMonitor is the seed Prometheus' and scrapes that port,
/// with the Service's name as job, often enough for the alerts' windows.
fn check_scrape(s: &Scrape) -> Result<()> {
    let port_name = check_service(s)?;
    check_monitor(s, &port_name)
}

/// The Service selects gardenlet's pods, on the port their container declares, and carries the
/// resource manager's annotation for the seed Prometheus' pod label. Returns its port's name.
fn check_service(s: &Scrape) -> Result<String> {
    let role = s.role;
    let name = s.service.name_any();
    ensure!(
        s.service.namespace().as_deref() == Some(GARDEN),
        "{role}: Service namespace"
    );
    let spec = s.service.spec.as_ref().context("Service spec")?;
    let pod_labels = s.pod_labels();
    let service_selector = spec.selector.clone().unwrap_or_default();
    ensure!(
        !service_selector.is_empty()
            && service_selector
                .iter()
                .all(|(k, v)| pod_labels.get(k) == Some(v)),
        "{role}: Service selector {service_selector:?}, gardenlet's pods {pod_labels:?}"
    );

    // The port, by the name gardenlet's container declares it.
    let ports = spec.ports.as_deref().unwrap_or_default();
    ensure!(ports.len() == 1, "{role}: Service ports {ports:?}");
    let port = &ports[0];
    let Some(IntOrString::String(target)) = &port.target_port else {
        bail!(
            "{role}: Service targetPort {:?}, want the container port's name",
            port.target_port
        );
    };
    let container_port = s
        .container()?
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(target.as_str()))
        .with_context(|| format!("{role}: gardenlet's container declares no port {target}"))?;
    ensure!(
        port.protocol.as_deref() == Some("TCP")
            && container_port.protocol.as_deref() == Some("TCP"),
        "{role}: protocols {:?} / {:?}",
        port.protocol,
        container_port.protocol
    );

    // The resource manager's annotation for the seed Prometheus' pod label.
    let alias = SEED_PROMETHEUS_POD_LABEL
        .strip_prefix(TO_POLICY_PREFIX)
        .context("the seed Prometheus' pod label")?;
    let key = format!("{FROM_POLICY_PREFIX}{alias}{FROM_POLICY_SUFFIX}");
    let allowed = s
        .service
        .annotations()
        .get(&key)
        .with_context(|| format!("{role}: Service {name} lacks annotation {key}"))?;
    let allowed: Vec<Value> = serde_json::from_str(allowed)
        .with_context(|| format!("{role}: {key} is no JSON list: {allowed}"))?;
    ensure!(
        allowed.contains(&json!({"protocol": "TCP", "port": container_port.container_port})),
        "{role}: {key} = {allowed:?} does not allow TCP {}",
        container_port.container_port
    );
    port.name.clone().context("a Service port without name")
}

/// The ServiceMonitor is the seed Prometheus' only, in `garden`, on the Service's port
/// `port_name`, often enough for the alerts' windows, with the Service's name as job.
fn check_monitor(s: &Scrape, port_name: &str) -> Result<()> {
    let role = s.role;
    let name = s.service.name_any();
    let m = &s.monitor;
    ensure!(m["apiVersion"] == "monitoring.coreos.com/v1" && m["kind"] == "ServiceMonitor");
    ensure!(
        m["metadata"]["namespace"] == GARDEN,
        "{role}: ServiceMonitor namespace"
    );
    let selected_by = prometheus_selects(&labels_of(m));
    ensure!(
        selected_by == [SEED_PROMETHEUS],
        "{role}: the ServiceMonitor is selected by {selected_by:?}, want only the seed Prometheus"
    );
    // Without a namespace selector a ServiceMonitor selects Services of its own namespace.
    let namespaces = &m["spec"]["namespaceSelector"];
    ensure!(
        namespaces.is_null() || *namespaces == json!({"matchNames": [GARDEN]}),
        "{role}: namespaceSelector {namespaces}"
    );
    let endpoints = m["spec"]["endpoints"].as_array().context("endpoints")?;
    ensure!(
        endpoints.len() == 1,
        "{role}: {} endpoints",
        endpoints.len()
    );
    let endpoint = &endpoints[0];
    ensure!(
        endpoint["port"] == port_name,
        "{role}: endpoint port {}, Service port {port_name}",
        endpoint["port"]
    );
    ensure!(
        endpoint["scheme"].is_null() || endpoint["scheme"] == "http",
        "{role}: the binary serves /metrics over plain HTTP"
    );
    ensure!(
        endpoint["path"].is_null() || endpoint["path"] == "/metrics",
        "{role}: path {}",
        endpoint["path"]
    );
    let interval = endpoint["interval"].as_str().unwrap_or("1m");
    ensure!(
        prometheus_duration_ms(interval).is_some_and(|ms| ms <= MAX_SCRAPE_INTERVAL_MS),
        "{role}: scrape interval {interval} (the seed Prometheus' default is 1m): the alerts' \
         2-minute windows want at most {MAX_SCRAPE_INTERVAL_MS} ms"
    );
    // job = the Service's name (prometheus-operator's default): nothing overrides it.
    let relabels_job = endpoint["relabelings"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|r| r["targetLabel"] == "job");
    ensure!(
        m["spec"]["jobLabel"].is_null() && !relabels_job,
        "{role}: the job label is overridden; the dashboard and alerts expect job {name}"
    );
    ensure!(
        name == format!("dependency-watchdog-{role}"),
        "{role}: job (the Service's name) {name}"
    );
    Ok(())
}

/// The PrometheusRule: `deploy/prober`'s rules, for the seed Prometheus' ruleSelector.
fn check_rules(monitoring: &BTreeMap<String, Vec<Value>>, prober: &Scrape) -> Result<()> {
    let rule: Value = one(monitoring, "PrometheusRule")?;
    let selected_by = prometheus_selects(&labels_of(&rule));
    ensure!(
        selected_by == [SEED_PROMETHEUS],
        "the PrometheusRule is selected by {selected_by:?}, want only the seed Prometheus"
    );
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/prober/prometheusrule.yaml");
    let text = std::fs::read_to_string(&path)?;
    let standalone: Value =
        serde_saphyr::from_str(&text).map_err(|e| anyhow!("parsing {}: {e}", path.display()))?;
    ensure!(
        rule["spec"] == standalone["spec"],
        "{MONITORING}'s PrometheusRule is not deploy/prober/prometheusrule.yaml's rules:\n{}\nvs\n{}",
        rule["spec"],
        standalone["spec"]
    );
    check_prometheus_rule(
        "seed",
        &rule,
        &prober.monitor,
        &exported_sample_names(),
        &exported_metrics_text(),
    )?;
    Ok(())
}

// --- the dashboard --------------------------------------------------------------------------

/// `deploy/grafana/dependency-watchdog.json` as the seed's Plutono (Grafana 7.5) reads it:
///
/// - every data source reference `{"type": "prometheus", "uid": "${datasource}"}` (Grafana 8.3
///   and later) becomes the name `"${datasource}"`;
/// - the data source variable starts at [`SEED_PROMETHEUS_DATASOURCE`];
/// - the job variable's "All" is the jobs it lists (those exporting `dwd_api_requests_total`)
///   instead of `.*`: in the seed Prometheus every Gardener component exports the process,
///   client and leader-election families the dashboard shows;
/// - the schema version is Plutono's.
///
/// Panels and queries are unchanged. Plutono does not stack time series (stacking came with
/// Grafana 8): the stacked panels show as lines.
fn plutono_dashboard(grafana: &Value) -> Result<Value> {
    let mut d = grafana.clone();
    name_data_sources(&mut d)?;
    d["schemaVersion"] = json!(PLUTONO_SCHEMA_VERSION);
    let vars = d["templating"]["list"]
        .as_array_mut()
        .context("no templating variables")?;
    let var = |vars: &[Value], name: &str| -> Result<usize> {
        vars.iter()
            .position(|v| v["name"] == name)
            .with_context(|| format!("no variable {name}"))
    };
    let ds = var(vars, "datasource")?;
    ensure!(vars[ds]["type"] == "datasource" && vars[ds]["query"] == "prometheus");
    vars[ds]["current"] = json!({
        "selected": true,
        "text": SEED_PROMETHEUS_DATASOURCE,
        "value": SEED_PROMETHEUS_DATASOURCE,
    });
    let job = var(vars, "job")?;
    ensure!(
        vars[job]["includeAll"] == true,
        "the job variable has no All"
    );
    vars[job]
        .as_object_mut()
        .context("job variable")?
        .remove("allValue");
    Ok(d)
}

/// Replaces every `"datasource": {"type": "prometheus", "uid": X}` in `v` by `"datasource": X`.
fn name_data_sources(v: &mut Value) -> Result<()> {
    match v {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                if key == "datasource" && value.is_object() {
                    ensure!(
                        value["type"] == "prometheus"
                            && value.as_object().map(|o| o.len()) == Some(2),
                        "a data source reference that is not {{type: prometheus, uid}}: {value}"
                    );
                    let uid = value["uid"].clone();
                    ensure!(uid.is_string(), "data source uid {uid}");
                    *value = uid;
                } else {
                    name_data_sources(value)?;
                }
            }
        }
        Value::Array(items) => items.iter_mut().try_for_each(name_data_sources)?,
        _ => {}
    }
    Ok(())
}

/// monitoring-dashboard.yaml as generated from `deploy/grafana/dependency-watchdog.json`.
fn dashboard_file_text(dashboard: &Value) -> Result<String> {
    let json = serde_json::to_string_pretty(dashboard)?;
    let mut text = format!(
        "\
# GENERATED from deploy/grafana/dependency-watchdog.json by
# crates/dependency-watchdog/tests/seed_monitoring.rs (`plutono_dashboard`), which fails when this
# file is not what it generates and then writes the file it expects: do not edit by hand.
#
# The dashboard for the seed's Plutono (Grafana 7.5), which gardenlet deploys in `garden` with a
# sidecar that loads every ConfigMap of `garden` labelled
# `{SEED_DASHBOARD_LABEL}: \"true\"` (gardener/gardener b312835d17,
# pkg/component/observability/plutono/plutono.go `dashboardLabel`, `refresherSidecar`).
# Its data source variable starts at `{SEED_PROMETHEUS_DATASOURCE}`, the seed Plutono's data source of the
# seed Prometheus, which monitoring.yaml has scrape the watchdog (the default data source,
# `prometheus-aggregate`, has none of its metrics). Data sources are named, not referenced by
# uid; the job variable's All is the watchdog's jobs; stacked time series show as lines.
# Apply it with monitoring.yaml, server-side (`kubectl apply --server-side`): client-side apply
# would copy the whole dashboard into its last-applied annotation. On a seed that is also the
# garden cluster, gardener-operator's Plutono loads ConfigMaps labelled
# `dashboard.monitoring.gardener.cloud/garden: \"true\"` instead.
apiVersion: v1
kind: ConfigMap
metadata:
  name: {DASHBOARD_CONFIG_MAP}
  namespace: {GARDEN}
  labels:
    app: dependency-watchdog
    {SEED_DASHBOARD_LABEL}: \"true\"
data:
  {DASHBOARD_KEY}: |
"
    );
    for line in json.lines() {
        text.push_str("    ");
        text.push_str(line);
        text.push('\n');
    }
    Ok(text)
}

/// Each selector of a metric the seed Prometheus also has from other jobs (every family but
/// `dwd_`) is restricted to the dashboard's jobs (`job=~"$job"`).
fn check_other_families_restricted(dashboard: &Value) -> Result<()> {
    let exprs = dashboard["panels"]
        .as_array()
        .context("panels")?
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_string));
    for expr in exprs {
        for name in metric_names_in(&expr) {
            if name.starts_with("dwd_") {
                continue;
            }
            let selectors: Vec<&str> = expr
                .match_indices(&format!("{name}{{"))
                .filter_map(|(at, m)| expr[at + m.len()..].split('}').next())
                .collect();
            ensure!(
                !selectors.is_empty() && selectors.iter().all(|s| s.contains("job=~\"$job\"")),
                "dashboard: {name} is not restricted to the watchdog's jobs in {expr}"
            );
        }
    }
    Ok(())
}

/// The dashboard ConfigMap is generated from deploy/grafana's, labelled for the seed Plutono,
/// and its dashboard is one Plutono reads, on the seed Prometheus, on exported metrics only.
fn check_dashboard_config_map() -> Result<()> {
    let expected = plutono_dashboard(&grafana_dashboard()?)?;
    let want = dashboard_file_text(&expected)?;
    let path = fixture_path(DASHBOARD);
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have != want {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(DASHBOARD);
        std::fs::write(&out, &want)?;
        bail!(
            "{} is not what deploy/grafana/dependency-watchdog.json generates (plutono_dashboard); \
             the expected file is at {}: check it and copy it over",
            path.display(),
            out.display()
        );
    }

    // What the file says, read as YAML: the label, the namespace and the dashboard.
    let cm: ConfigMap = one(&fixture(DASHBOARD)?, "ConfigMap")?;
    ensure!(
        cm.namespace().as_deref() == Some(GARDEN),
        "dashboard namespace"
    );
    ensure!(
        cm.labels().get(SEED_DASHBOARD_LABEL).map(String::as_str) == Some("true"),
        "dashboard labels {:?}",
        cm.labels()
    );
    let data = cm.data.unwrap_or_default();
    let keys: Vec<&String> = data.keys().collect();
    ensure!(keys == [DASHBOARD_KEY], "dashboard ConfigMap keys {keys:?}");
    let dashboard: Value = serde_json::from_str(&data[DASHBOARD_KEY])
        .with_context(|| format!("{DASHBOARD}: {DASHBOARD_KEY} is not JSON"))?;
    ensure!(
        dashboard == expected,
        "{DASHBOARD}: the YAML does not hold the generated JSON"
    );

    let mut references = Vec::new();
    collect_data_sources(&dashboard, &mut references);
    ensure!(!references.is_empty(), "no data source in the dashboard");
    let unnamed: Vec<&Value> = references
        .into_iter()
        .filter(|r| *r != "${datasource}")
        .collect();
    ensure!(
        unnamed.is_empty(),
        "data sources other than the variable \"${{datasource}}\" by name: {unnamed:?}"
    );
    let vars = dashboard["templating"]["list"]
        .as_array()
        .context("variables")?;
    let var = |name: &str| vars.iter().find(|v| v["name"] == name);
    ensure!(
        var("datasource").is_some_and(|v| v["current"]["value"] == SEED_PROMETHEUS_DATASOURCE),
        "the data source variable does not start at {SEED_PROMETHEUS_DATASOURCE}"
    );
    let job = var("job").context("no job variable")?;
    ensure!(
        job["allValue"].is_null() && job["datasource"] == "${datasource}",
        "job variable: {job}"
    );
    check_other_families_restricted(&dashboard)?;
    check_dashboard(
        DASHBOARD,
        &dashboard,
        &exported_sample_names(),
        &exported_metrics_text(),
    )
}

/// Every `datasource` value in `v`.
fn collect_data_sources<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    match v {
        Value::Object(map) => {
            for (key, value) in map {
                if key == "datasource" {
                    out.push(value);
                } else {
                    collect_data_sources(value, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| collect_data_sources(i, out)),
        _ => {}
    }
}

#[test]
fn monitoring_files_fit_gardeners_seed_monitoring() -> Result<()> {
    let monitoring = fixture(MONITORING)?;
    let kinds: BTreeMap<&str, usize> = monitoring
        .iter()
        .map(|(k, docs)| (k.as_str(), docs.len()))
        .collect();
    ensure!(
        kinds == BTreeMap::from([("PrometheusRule", 1), ("Service", 2), ("ServiceMonitor", 2)]),
        "{MONITORING}: kinds {kinds:?}"
    );
    let scrapes = ROLES
        .iter()
        .map(|role| Scrape::load(role, &monitoring))
        .collect::<Result<Vec<_>>>()?;
    for s in &scrapes {
        check_scrape(s)?;
    }
    check_rules(&monitoring, &scrapes[0])?;
    check_dashboard_config_map()
}

#[test]
fn plutono_dashboard_names_data_sources() -> Result<()> {
    let grafana = json!({
        "panels": [{"datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "targets": [{"datasource": {"type": "prometheus", "uid": "${datasource}"}}]}],
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "current": {}},
            {"name": "job", "includeAll": true, "allValue": ".*",
             "datasource": {"type": "prometheus", "uid": "${datasource}"}}]},
        "schemaVersion": 39,
    });
    let plutono = plutono_dashboard(&grafana)?;
    assert_eq!(plutono["panels"][0]["datasource"], "${datasource}");
    assert_eq!(
        plutono["panels"][0]["targets"][0]["datasource"],
        "${datasource}"
    );
    assert_eq!(
        plutono["templating"]["list"][0]["current"]["value"],
        "prometheus-seed"
    );
    assert_eq!(plutono["templating"]["list"][1].get("allValue"), None);
    assert_eq!(
        plutono["templating"]["list"][1]["datasource"],
        "${datasource}"
    );
    assert_eq!(plutono["schemaVersion"], 27);
    // A reference to a concrete data source is not silently turned into a name.
    let mut concrete = grafana.clone();
    concrete["panels"][0]["datasource"] = json!({"type": "loki", "uid": "P1809F7CD0C75ACF3"});
    let refused = plutono_dashboard(&concrete).expect_err("a concrete data source");
    assert!(
        refused.to_string().contains("P1809F7CD0C75ACF3"),
        "{refused}"
    );
    Ok(())
}

// --- on a kube-apiserver --------------------------------------------------------------------

/// Installs the prometheus-operator CRDs and waits until the API server serves them.
async fn install_crds(admin: &kube::Client) -> Result<()> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/prometheus-operator");
    let api: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for file in CRDS {
        let path = dir.join(file);
        let text = std::fs::read_to_string(&path)?;
        let crd: CustomResourceDefinition = serde_saphyr::from_str(&text)
            .map_err(|e| anyhow!("parsing {}: {e}", path.display()))?;
        api.create(&PostParams::default(), &crd)
            .await
            .with_context(|| format!("creating CRD {file}"))?;
        let name = crd.name_any();
        tokio::time::timeout(
            DEADLINE,
            kube::runtime::wait::await_condition(
                api.clone(),
                &name,
                kube::runtime::conditions::is_crd_established(),
            ),
        )
        .await
        .map_err(|_| anyhow!("CRD {name} not established within {DEADLINE:?}"))??;
    }
    Ok(())
}

/// The API of a document's kind in `garden` (kinds from discovery, which follows the CRDs'
/// establishment).
async fn api_of(admin: &kube::Client, doc: &Value) -> Result<Api<DynamicObject>> {
    let (group, version) = match doc["apiVersion"].as_str().context("no apiVersion")? {
        v if v.contains('/') => v.split_once('/').context("apiVersion")?,
        v => ("", v),
    };
    let gvk = GroupVersionKind::gvk(group, version, doc["kind"].as_str().context("no kind")?);
    let (resource, _) = eventually(DEADLINE, &format!("{gvk:?} in discovery"), || async {
        match kube::discovery::pinned_kind(admin, &gvk).await {
            Ok(found) => Ok(Some(found)),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
    .map_err(|e| anyhow!(e))?;
    Ok(Api::namespaced_with(admin.clone(), GARDEN, &resource))
}

/// Server-side apply of `doc` with field validation Strict: an unknown or duplicate field, or
/// one the schema refuses, fails the request.
async fn apply_strict(admin: &kube::Client, doc: &Value) -> Result<()> {
    let name = doc["metadata"]["name"].as_str().context("no name")?;
    api_of(admin, doc)
        .await?
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).validation_strict(),
            &Patch::Apply(doc),
        )
        .await
        .with_context(|| format!("the API server refuses {} {name}", doc["kind"]))?;
    Ok(())
}

/// `doc` is refused, with a message naming `field`.
async fn refused(admin: &kube::Client, doc: &Value, field: &str) -> Result<()> {
    match apply_strict(admin, doc).await {
        Ok(()) => bail!("accepted, with {field}: {doc}"),
        Err(e) => {
            let message = format!("{e:#}");
            ensure!(
                message.contains(field),
                "refused, but not for {field}: {message}"
            );
            Ok(())
        }
    }
}

/// The names of the objects of `api` that `selector` selects.
async fn selected<K>(api: &Api<K>, selector: &Selector) -> Result<BTreeSet<String>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(api
        .list(&ListParams::default().labels_from(selector))
        .await?
        .items
        .iter()
        .map(|o| o.name_any())
        .collect())
}

/// Applies every shipped object, after showing that the API server refuses an unknown field
/// and a `for` that is no Prometheus duration (so that an accepted object means something).
async fn apply_shipped(
    admin: &kube::Client,
    monitoring: &BTreeMap<String, Vec<Value>>,
    prober: &Scrape,
) -> Result<()> {
    let mut unknown = prober.monitor.clone();
    unknown["metadata"]["name"] = json!("unknown-field");
    unknown["spec"]["endpoints"][0]["scrapeEvery"] = json!("30s");
    refused(admin, &unknown, "scrapeEvery").await?;
    let mut bad_for = one::<Value>(monitoring, "PrometheusRule")?;
    bad_for["metadata"]["name"] = json!("bad-for");
    bad_for["spec"]["groups"][0]["rules"][0]["for"] = json!("one minute");
    refused(admin, &bad_for, "rules[0].for").await?;

    let dashboard = fixture(DASHBOARD)?;
    for doc in monitoring.values().chain(dashboard.values()).flatten() {
        apply_strict(admin, doc).await?;
    }
    Ok(())
}

/// gardenlet's pods, as its Deployments create them (with their PriorityClass and
/// ServiceAccounts, which admission wants to exist).
async fn create_gardenlets_pods(admin: &kube::Client, scrapes: &[Scrape]) -> Result<()> {
    let priority_class: PriorityClass = serde_json::from_value(json!({
        "metadata": {"name": PRIORITY_CLASS},
        "value": PRIORITY,
    }))?;
    apply(&Api::all(admin.clone()), &priority_class).await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), GARDEN);
    for s in scrapes {
        let sa = Gardener::load(s.role)?.service_account()?;
        apply(&Api::namespaced(admin.clone(), GARDEN), &sa).await?;
        pods.create(&PostParams::default(), &s.pod()?)
            .await
            .with_context(|| format!("{}: creating gardenlet's pod", s.role))?;
    }
    Ok(())
}

/// As the API server selects: `s`'s Service selects its role's pod and only it, on a port that
/// pod declares; its ServiceMonitor selects that Service and only it.
async fn check_selected_pod_and_service(admin: &kube::Client, s: &Scrape) -> Result<()> {
    let role = s.role;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), GARDEN);
    let services: Api<Service> = Api::namespaced(admin.clone(), GARDEN);
    let service = services.get(&s.service.name_any()).await?;
    let spec = service.spec.clone().unwrap_or_default();
    let by_service: Selector = spec.selector.unwrap_or_default().into_iter().collect();
    let pod_name = s.pod()?.name_any();
    let found = selected(&pods, &by_service).await?;
    ensure!(
        found == BTreeSet::from([pod_name.clone()]),
        "{role}: the Service selects pods {found:?}, want {pod_name}"
    );
    let target = match spec.ports.as_deref() {
        Some([port]) => port.target_port.clone(),
        other => bail!("{role}: Service ports {other:?}"),
    };
    let pod = pods.get(&pod_name).await?;
    let declared = pod
        .spec
        .iter()
        .flat_map(|spec| &spec.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .any(|p| Some(IntOrString::String(p.name.clone().unwrap_or_default())) == target);
    ensure!(declared, "{role}: the pod declares no port {target:?}");

    let by_monitor = selector(&s.monitor["spec"]["selector"])?;
    let found = selected(&services, &by_monitor).await?;
    ensure!(
        found == BTreeSet::from([service.name_any()]),
        "{role}: the ServiceMonitor selects Services {found:?}"
    );
    Ok(())
}

/// The objects of `kind` (monitoring.coreos.com/v1) in all namespaces.
async fn all_of(admin: &kube::Client, kind: &str) -> Result<Api<DynamicObject>> {
    let gvk = GroupVersionKind::gvk("monitoring.coreos.com", "v1", kind);
    let (resource, _) = kube::discovery::pinned_kind(admin, &gvk).await?;
    Ok(Api::all_with(admin.clone(), &resource))
}

/// As the API server selects across all namespaces: the seed Prometheus' selectors select
/// exactly the shipped ServiceMonitors and PrometheusRule, the other Prometheis' none of
/// them, and the seed Plutono's sidecar the dashboard.
async fn check_selected_by_seed_monitoring(
    admin: &kube::Client,
    monitoring: &BTreeMap<String, Vec<Value>>,
) -> Result<()> {
    for kind in ["ServiceMonitor", "PrometheusRule"] {
        let api = all_of(admin, kind).await?;
        let shipped: BTreeSet<String> = monitoring
            .get(kind)
            .into_iter()
            .flatten()
            .filter_map(|d| d["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        let by_seed: Selector = [(PROMETHEUS_LABEL, SEED_PROMETHEUS)].into_iter().collect();
        let found = selected(&api, &by_seed).await?;
        ensure!(
            found == shipped,
            "the seed Prometheus selects the {kind}s {found:?}, want {shipped:?}"
        );
        for other in OTHER_SEED_PROMETHEI {
            let by_other: Selector = [(PROMETHEUS_LABEL, *other)].into_iter().collect();
            let found = selected(&api, &by_other).await?;
            ensure!(
                found.is_empty(),
                "the {other} Prometheus selects the {kind}s {found:?}"
            );
        }
    }
    let by_plutono: Selector = [(SEED_DASHBOARD_LABEL, "true")].into_iter().collect();
    let found = selected(
        &Api::<ConfigMap>::namespaced(admin.clone(), GARDEN),
        &by_plutono,
    )
    .await?;
    ensure!(
        found == BTreeSet::from([DASHBOARD_CONFIG_MAP.to_string()]),
        "the seed Plutono loads {found:?}"
    );
    Ok(())
}

#[tokio::test]
async fn seed_apiserver_accepts_and_selects_the_monitoring_objects() -> Result<()> {
    let env = TestEnv::start().await?;
    let seed = env.start_apiserver("monitoring-seed").await?;
    let admin = seed.client().await?;
    ensure_namespace(&admin, GARDEN).await?;
    install_crds(&admin).await?;

    let monitoring = fixture(MONITORING)?;
    let scrapes = ROLES
        .iter()
        .map(|role| Scrape::load(role, &monitoring))
        .collect::<Result<Vec<_>>>()?;
    apply_shipped(&admin, &monitoring, &scrapes[0]).await?;
    create_gardenlets_pods(&admin, &scrapes).await?;
    for s in &scrapes {
        check_selected_pod_and_service(&admin, s).await?;
    }
    check_selected_by_seed_monitoring(&admin, &monitoring).await
}
