//! Shadow mode next to the reference (issue 16): what `tests/shadow.rs` needs to run ours with
//! `--shadow` under exactly `deploy/shadow/`'s objects beside the acting reference on one seed,
//! and to check afterwards, from the seed's audit log, that ours wrote nothing but Events about
//! its own pod.
//!
//! - [`ShadowManifests`]: `deploy/shadow/<role>.yaml` and `<role>-config.yaml` as shipped: every
//!   object applied to the seed as it is ([`apply_all`]), the Deployment's command line (checked
//!   against Gardener's, [`gardener_args`]), the config, the ClusterRole's permissions.
//! - [`service_account_kubeconfig`]: a kubeconfig with a token of the shipped ServiceAccount
//!   (TokenRequest API), as the pod's in-cluster credential would be.
//! - [`read_audit`]: the seed's audit log (JSON lines) as [`AuditEntry`]s.
//! - [`records`], [`http_get`]: ours' `GET /shadow.json` and metrics.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, ensure};
use dwd_testenv::ApiServer;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role as RbacRole, RoleBinding};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::scenario::Role;
use crate::world::GARDEN;

/// `deploy/shadow/` of this repository.
pub fn shadow_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/shadow")
}

/// One role's shipped shadow manifests (`deploy/shadow/<role>.yaml` and `<role>-config.yaml`).
#[derive(Debug, Clone)]
pub struct ShadowManifests {
    /// Prober or weeder.
    pub role: Role,
    docs: Vec<Value>,
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Prober => "prober",
        Role::Weeder => "weeder",
    }
}

impl ShadowManifests {
    /// Reads both files of `role`.
    pub fn load(role: Role) -> Result<ShadowManifests> {
        let mut docs = Vec::new();
        for file in [
            format!("{}.yaml", role_name(role)),
            format!("{}-config.yaml", role_name(role)),
        ] {
            let path = shadow_dir().join(file);
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("read {}", path.display()))?;
            let parsed: Vec<Value> = serde_saphyr::from_multiple(&text)
                .map_err(|e| anyhow!("parse {}: {e}", path.display()))?;
            docs.extend(parsed.into_iter().filter(|d| !d.is_null()));
        }
        Ok(ShadowManifests { role, docs })
    }

    /// The one document of `kind`.
    pub fn one(&self, kind: &str) -> Result<&Value> {
        let found: Vec<&Value> = self.docs.iter().filter(|d| d["kind"] == kind).collect();
        ensure!(
            found.len() == 1,
            "deploy/shadow/{}: {} {kind}s, want 1",
            role_name(self.role),
            found.len()
        );
        Ok(found[0])
    }

    /// The ServiceAccount's name.
    pub fn service_account(&self) -> Result<String> {
        self.one("ServiceAccount")?["metadata"]["name"]
            .as_str()
            .map(str::to_string)
            .context("ServiceAccount without a name")
    }

    /// The user the apiserver sees: `system:serviceaccount:garden:<name>`.
    pub fn username(&self) -> Result<String> {
        Ok(format!(
            "system:serviceaccount:{GARDEN}:{}",
            self.service_account()?
        ))
    }

    /// The Deployment's command line without the binary's path.
    pub fn args(&self) -> Result<Vec<String>> {
        let args =
            deployment_args(self.one("Deployment")?).context("the Deployment of deploy/shadow")?;
        ensure!(
            !args.is_empty(),
            "the Deployment's command has no arguments"
        );
        Ok(args)
    }

    /// `dep-config.yaml` of the ConfigMap.
    pub fn config(&self) -> Result<String> {
        self.one("ConfigMap")?["data"]["dep-config.yaml"]
            .as_str()
            .map(str::to_string)
            .context("the ConfigMap has no dep-config.yaml")
    }

    /// Every `(apiGroup, resource, verb)` the ClusterRole grants.
    pub fn cluster_permissions(&self) -> Result<Vec<(String, String, String)>> {
        let rules = self.one("ClusterRole")?["rules"]
            .as_array()
            .context("a ClusterRole without rules")?;
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut out = Vec::new();
        for rule in rules {
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        out.push((group.clone(), resource.clone(), verb));
                    }
                }
            }
        }
        Ok(out)
    }
}

/// Applies every document of the role's files (RBAC, ConfigMap, Deployment, Service) with
/// strict field validation, as `kubectl apply -f deploy/shadow/` would: the seed accepts them as
/// written. (The test environment runs no controllers: the Deployment creates no pod.)
pub async fn apply_all(manifests: &ShadowManifests, admin: &kube::Client) -> Result<()> {
    apply_documents(&manifests.docs, admin, "deploy/shadow").await
}

/// Applies `docs` (ServiceAccounts, RBAC, ConfigMaps, Deployments, Services) with strict field
/// validation, each as it is written; `source` names the files in errors.
pub async fn apply_documents(docs: &[Value], admin: &kube::Client, source: &str) -> Result<()> {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{ConfigMap, Service};
    for doc in docs {
        let kind = doc["kind"].as_str().context("a document without kind")?;
        let (resource, namespaced) = match kind {
            "ServiceAccount" => (ApiResource::erase::<ServiceAccount>(&()), true),
            "ClusterRole" => (ApiResource::erase::<ClusterRole>(&()), false),
            "ClusterRoleBinding" => (ApiResource::erase::<ClusterRoleBinding>(&()), false),
            "Role" => (ApiResource::erase::<RbacRole>(&()), true),
            "RoleBinding" => (ApiResource::erase::<RoleBinding>(&()), true),
            "ConfigMap" => (ApiResource::erase::<ConfigMap>(&()), true),
            "Deployment" => (ApiResource::erase::<Deployment>(&()), true),
            "Service" => (ApiResource::erase::<Service>(&()), true),
            other => anyhow::bail!("unexpected kind {other} in {source}"),
        };
        let name = doc["metadata"]["name"]
            .as_str()
            .with_context(|| format!("{kind} without a name"))?;
        let api: Api<DynamicObject> = if namespaced {
            let ns = doc["metadata"]["namespace"]
                .as_str()
                .with_context(|| format!("{kind} {name} without a namespace"))?;
            Api::namespaced_with(admin.clone(), ns, &resource)
        } else {
            Api::all_with(admin.clone(), &resource)
        };
        api.patch(
            name,
            &PatchParams::apply("dwd-parity-shadow")
                .force()
                .validation_strict(),
            &Patch::Apply(doc),
        )
        .await
        .with_context(|| format!("apply {kind} {name}"))?;
    }
    Ok(())
}

/// The command line of Gardener's Deployment for `role` (`deploy/gardener/<role>.yaml`),
/// without the binary's path.
pub fn gardener_args(role: Role) -> Result<Vec<String>> {
    let deployment = gardener_documents(role)?
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .with_context(|| format!("no Deployment in deploy/gardener/{}.yaml", role_name(role)))?;
    deployment_args(&deployment).context("Gardener's Deployment")
}

/// Every document of `deploy/gardener/<role>.yaml` (what gardenlet ships for `role`).
pub fn gardener_documents(role: Role) -> Result<Vec<Value>> {
    let path = crate::world::gardener_dir().join(format!("{}.yaml", role_name(role)));
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&text).map_err(|e| anyhow!("parse {}: {e}", path.display()))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// The command line of a Deployment's first container without the binary's path.
fn deployment_args(deployment: &Value) -> Result<Vec<String>> {
    deployment["spec"]["template"]["spec"]["containers"][0]["command"]
        .as_array()
        .context("its container has no command")?
        .iter()
        .skip(1)
        .map(|a| {
            a.as_str()
                .map(str::to_string)
                .context("a non-string argument")
        })
        .collect()
}

/// A kubeconfig for `seed` (through its front door) with a one-hour token of the ServiceAccount
/// `garden/<name>` from the TokenRequest API: the credential a pod of that ServiceAccount gets
/// ([`dwd_testenv::service_account::kubeconfig`] in the shipped namespace).
pub async fn service_account_kubeconfig(
    seed: &ApiServer,
    admin: &kube::Client,
    name: &str,
) -> Result<String> {
    Ok(dwd_testenv::service_account::kubeconfig(seed, admin, GARDEN, name).await?)
}

// --- the audit log --------------------------------------------------------------------------

/// Verbs that change something.
pub const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

/// One request in the seed's audit log (stage `ResponseComplete` or `ResponseStarted`).
#[derive(Debug, Clone, PartialEq)]
pub struct AuditEntry {
    /// Authenticated user name.
    pub user: String,
    /// Kubernetes verb (`get`, `list`, `watch`, `create`, `patch`, …).
    pub verb: String,
    /// API group (`""` for core).
    pub api_group: String,
    /// Resource (`pods`, `deployments`, …).
    pub resource: String,
    /// Subresource (`status`, `scale`, …) or `""`.
    pub subresource: String,
    /// Namespace or `""`.
    pub namespace: String,
    /// Object name or `""`.
    pub name: String,
    /// The request URI.
    pub uri: String,
    /// Audit stage.
    pub stage: String,
    /// Response code, if any.
    pub code: Option<i64>,
    /// When the request was received (RFC 3339 with microseconds).
    pub received: String,
    /// The client's `User-Agent` (tells two binaries with one identity apart).
    pub user_agent: String,
    /// The request body, when the audit policy logs it (`Request` level): a patch or the
    /// object written.
    pub request_object: Option<Value>,
}

impl AuditEntry {
    /// Whether the verb changes something.
    pub fn is_write(&self) -> bool {
        WRITE_VERBS.contains(&self.verb.as_str())
    }

    /// `verb group/resource[/subresource] namespace/name (code)` for messages.
    pub fn describe(&self) -> String {
        let sub = if self.subresource.is_empty() {
            String::new()
        } else {
            format!("/{}", self.subresource)
        };
        format!(
            "{} {} {}/{}{sub} {}/{} ({}) by {}",
            self.received,
            self.verb,
            self.api_group,
            self.resource,
            self.namespace,
            self.name,
            self.code.map(|c| c.to_string()).unwrap_or_default(),
            self.user
        )
    }
}

fn parse_entry(line: &str) -> Option<AuditEntry> {
    let v: Value = serde_json::from_str(line).ok()?;
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let o = &v["objectRef"];
    Some(AuditEntry {
        user: s(&v["user"]["username"]),
        verb: s(&v["verb"]),
        api_group: s(&o["apiGroup"]),
        resource: s(&o["resource"]),
        subresource: s(&o["subresource"]),
        namespace: s(&o["namespace"]),
        name: s(&o["name"]),
        uri: s(&v["requestURI"]),
        stage: s(&v["stage"]),
        code: v["responseStatus"]["code"].as_i64(),
        received: s(&v["requestReceivedTimestamp"]),
        user_agent: s(&v["userAgent"]),
        request_object: v.get("requestObject").filter(|o| !o.is_null()).cloned(),
    })
}

/// Every entry of the audit log at `path` (lines that are not audit events are skipped).
pub fn read_audit(path: &Path) -> Result<Vec<AuditEntry>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    Ok(text.lines().filter_map(parse_entry).collect())
}

/// Makes a request only the admin makes (a GET of the namespace `marker`, which need not
/// exist) and waits until the audit log at `log` has it: everything before it is in the log by
/// then (the log is written in batches). Every entry, at most 30 s.
pub async fn flush_audit(
    admin: &kube::Client,
    log: &Path,
    marker: &str,
) -> Result<Vec<AuditEntry>> {
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .get_opt(marker)
        .await;
    dwd_testenv::eventually(
        std::time::Duration::from_secs(30),
        "the audit log catches up",
        || async move {
            let entries = read_audit(log).map_err(|e| format!("{e:#}"))?;
            Ok(entries
                .iter()
                .any(|e| e.resource == "namespaces" && e.name == marker)
                .then_some(entries))
        },
    )
    .await
    .map_err(|e| anyhow!(e))
}

// --- ours' endpoints ------------------------------------------------------------------------

/// `GET path` on 127.0.0.1:`port` (HTTP/1.0): status and body.
pub async fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .with_context(|| format!("connect to 127.0.0.1:{port}"))?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no HTTP status")?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// Ours' resolved comparisons (`GET /shadow.json` on its metrics port), oldest first.
pub async fn records(metrics_port: u16) -> Result<Vec<Value>> {
    let (status, body) = http_get(metrics_port, "/shadow.json").await?;
    ensure!(status == 200, "GET /shadow.json: {status} {body}");
    let parsed: Value = serde_json::from_str(&body).context("parse /shadow.json")?;
    parsed
        .as_array()
        .cloned()
        .context("/shadow.json is not a list")
}

/// The first record about `key` for `action` with `verdict`.
pub fn find_record<'a>(
    records: &'a [Value],
    key_prefix: &str,
    action: &str,
    verdict: &str,
) -> Option<&'a Value> {
    records.iter().find(|r| {
        r["key"].as_str().is_some_and(|k| k.starts_with(key_prefix))
            && r["action"] == action
            && r["verdict"] == verdict
    })
}
