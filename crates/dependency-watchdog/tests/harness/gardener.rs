//! gardenlet's objects for the prober and the weeder (`deploy/gardener/`) as test fixtures:
//! their command lines, configs and RBAC, applied to a test seed as gardenlet applies them.
//! Shared by the tests that run the binary exactly as Gardener deploys it (tests/gardener.rs,
//! and tests/image.rs from the container image).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::Resource;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The namespace gardenlet deploys the watchdog in.
pub(crate) const GARDEN: &str = "garden";

/// A file of `deploy/gardener/`.
pub(crate) fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/gardener")
        .join(name)
}

/// The YAML documents of a fixture, by kind.
pub(crate) fn fixture(name: &str) -> Result<BTreeMap<String, Vec<Value>>> {
    let path = fixture_path(name);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .map_err(|e| anyhow!("parsing {}: {e}", path.display()))?;
    let mut by_kind: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for doc in docs.into_iter().filter(|d| !d.is_null()) {
        let kind = doc["kind"].as_str().context("a document without kind")?;
        by_kind.entry(kind.to_string()).or_default().push(doc);
    }
    Ok(by_kind)
}

/// The one document of `kind`, typed.
pub(crate) fn one<T: DeserializeOwned>(
    docs: &BTreeMap<String, Vec<Value>>,
    kind: &str,
) -> Result<T> {
    let found = docs.get(kind).map(Vec::as_slice).unwrap_or_default();
    ensure!(
        found.len() == 1,
        "{} {kind}s in the fixture, want 1",
        found.len()
    );
    serde_json::from_value(found[0].clone()).with_context(|| format!("{kind} is not valid"))
}

/// One role's objects as gardenlet generates them.
pub(crate) struct Gardener {
    /// The fixture's documents by kind.
    pub(crate) docs: BTreeMap<String, Vec<Value>>,
}

impl Gardener {
    /// `prober` or `weeder`.
    pub(crate) fn load(role: &str) -> Result<Gardener> {
        Ok(Gardener {
            docs: fixture(&format!("{role}.yaml"))?,
        })
    }

    /// The ServiceAccount.
    pub(crate) fn service_account(&self) -> Result<ServiceAccount> {
        one(&self.docs, "ServiceAccount")
    }

    /// The container's command line, binary path first.
    pub(crate) fn command(&self) -> Result<Vec<String>> {
        let d: Deployment = one(&self.docs, "Deployment")?;
        d.spec
            .and_then(|s| s.template.spec)
            .and_then(|s| s.containers.into_iter().next())
            .and_then(|c| c.command)
            .context("the Deployment has no command")
    }

    /// `dep-config.yaml` of the ConfigMap.
    pub(crate) fn config(&self) -> Result<String> {
        let cm: ConfigMap = one(&self.docs, "ConfigMap")?;
        cm.data
            .and_then(|d| d.get("dep-config.yaml").cloned())
            .context("the ConfigMap has no dep-config.yaml")
    }

    /// Applies ServiceAccount, ClusterRole(Binding) and Role(Binding) to the seed.
    pub(crate) async fn apply_rbac(&self, admin: &kube::Client) -> Result<()> {
        apply(
            &Api::namespaced(admin.clone(), GARDEN),
            &self.service_account()?,
        )
        .await?;
        apply::<ClusterRole>(&Api::all(admin.clone()), &one(&self.docs, "ClusterRole")?).await?;
        apply::<ClusterRoleBinding>(
            &Api::all(admin.clone()),
            &one(&self.docs, "ClusterRoleBinding")?,
        )
        .await?;
        apply::<Role>(
            &Api::namespaced(admin.clone(), GARDEN),
            &one(&self.docs, "Role")?,
        )
        .await?;
        apply::<RoleBinding>(
            &Api::namespaced(admin.clone(), GARDEN),
            &one(&self.docs, "RoleBinding")?,
        )
        .await
    }
}

/// Gardener's prober config with its intervals shortened so that a test takes a minute, not
/// ten: probes every second from one second after start, nodes count as gone 3 s after their
/// last renewal (grace 4 s), MCM's scale-up delay `mcm_up_delay`. Levels, targets and
/// everything else as gardenlet writes them.
pub(crate) fn shortened(config: &str, mcm_up_delay: Duration) -> Result<String> {
    ensure!(
        config.contains("probeInterval: 30s\n") && config.contains("initialDelay: 30s\n"),
        "Gardener's config changed shape:\n{config}"
    );
    Ok(config
        .replace(
            "probeInterval: 30s\n",
            "probeInterval: 1s\ninitialDelay: 1s\nprobeTimeout: 5s\nkcmNodeMonitorGraceDuration: 4s\n",
        )
        .replace(
            "initialDelay: 30s\n",
            &format!("initialDelay: {}s\n", mcm_up_delay.as_secs()),
        ))
}

/// Server-side apply of `obj` (forced, as gardenlet's resource manager applies).
pub(crate) async fn apply<K>(api: &Api<K>, obj: &K) -> Result<()>
where
    K: Resource + Serialize + DeserializeOwned + Clone + std::fmt::Debug,
{
    let name = obj.meta().name.clone().context("object without name")?;
    api.patch(
        &name,
        &PatchParams::apply("dwd-gardener-test").force(),
        &Patch::Apply(obj),
    )
    .await
    .with_context(|| format!("applying {name}"))?;
    Ok(())
}

/// Creates namespace `name` unless it exists.
pub(crate) async fn ensure_namespace(client: &kube::Client, name: &str) -> Result<()> {
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
