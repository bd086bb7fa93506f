//! The shoot's control-plane objects in the seed, against the seed apiserver.
//!
//! Everything lives in the shoot namespace (`shoot--<project>--<name>`), except the
//! cluster-scoped `Cluster` named like it: the probe Secret with the shoot kubeconfig, the
//! `Cluster` carrying the `Shoot` the prober reconciles on, one Machine per node, the
//! Deployments the prober scales, and the Pods and EndpointSlices the weeder watches.
//! Nothing here runs: status is written by the simulator through status subresources.

use std::collections::BTreeMap;

use chrono::Utc;
use dwd_core::gardener::{CLUSTER, Kind, MACHINE};
use futures::TryStreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};

use crate::{
    CREATE_CONCURRENCY, Result, SimError, create_json, is_conflict, is_not_found, json_err,
    k8s_time, kube_err,
};

/// Default name of the probe Secret (what Gardener creates for the watchdog).
pub const DEFAULT_PROBE_SECRET: &str = "shoot-access-dependency-watchdog-probe";
/// Key of the kubeconfig in the probe Secret.
pub const KUBECONFIG_KEY: &str = "kubeconfig";
/// Default Deployments and replicas: KCM 2, MCM 1, CA 1.
pub const DEFAULT_DEPLOYMENTS: [(&str, i32); 3] = [
    ("kube-controller-manager", 2),
    ("machine-controller-manager", 1),
    ("cluster-autoscaler", 1),
];
/// Label of EndpointSlices naming their Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The Machine phase of a healthy machine.
pub const MACHINE_RUNNING: &str = "Running";
/// Image of every simulated container: nothing ever pulls it.
const IMAGE: &str = "registry.invalid/dwd-sim:none";
/// Name of the single container of simulated pods.
const CONTAINER: &str = "main";
/// How often a read-modify-write of the Cluster retries after a conflict.
const CONFLICT_RETRIES: usize = 5;

/// An `ApiResource` of one of Gardener's kinds (names from `dwd_core::gardener`).
fn resource(kind: Kind) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(kind.group, kind.version, kind.kind),
        kind.plural,
    )
}

/// `extensions.gardener.cloud/v1alpha1` `Cluster` (cluster-scoped).
pub fn cluster_resource() -> ApiResource {
    resource(CLUSTER)
}

/// `machine.sapcloud.io/v1alpha1` `Machine` (namespaced).
pub fn machine_resource() -> ApiResource {
    resource(MACHINE)
}

/// Name of the Machine of `node`.
pub fn machine_name(node: &str) -> String {
    format!("machine-{node}")
}

/// Name of the simulated EndpointSlice of `service`.
pub fn endpoint_slice_name(service: &str) -> String {
    format!("{service}-sim")
}

/// `(project, shoot name)` from `shoot--<project>--<name>`; other namespaces are shoot
/// `<namespace>` of project `sim`.
pub fn shoot_name_of(namespace: &str) -> (String, String) {
    namespace
        .strip_prefix("shoot--")
        .and_then(|rest| rest.split_once("--"))
        .map(|(p, n)| (p.to_string(), n.to_string()))
        .unwrap_or_else(|| ("sim".to_string(), namespace.to_string()))
}

/// A worker pool of the Shoot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerPool {
    /// Pool name (nodes carry it as label `worker.gardener.cloud/pool`).
    pub name: String,
    /// `machineControllerManager.nodeConditions`; `None` leaves the field out (the
    /// watchdog's defaults apply).
    pub node_conditions: Option<Vec<String>>,
}

impl WorkerPool {
    /// A pool with default node conditions.
    pub fn new(name: impl Into<String>) -> Self {
        WorkerPool {
            name: name.into(),
            node_conditions: None,
        }
    }
}

/// What the `Shoot` inside the `Cluster` says: the fields the prober reconciles on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShootState {
    /// `status.lastOperation` `(type, state)`, e.g. `("Reconcile", "Succeeded")`; `None`
    /// leaves it out.
    pub last_operation: Option<(String, String)>,
    /// `spec.hibernation.enabled`.
    pub hibernation_enabled: bool,
    /// `status.isHibernated`.
    pub is_hibernated: bool,
    /// Whether `metadata.deletionTimestamp` is set.
    pub deletion_timestamp: bool,
    /// `spec.provider.workers`.
    pub workers: Vec<WorkerPool>,
    /// `spec.kubernetes.kubeControllerManager.nodeMonitorGracePeriod` (e.g. `"40s"`).
    pub node_monitor_grace_period: Option<String>,
}

impl Default for ShootState {
    /// A reconciled, awake shoot with one pool `worker-a`.
    fn default() -> Self {
        ShootState {
            last_operation: Some(("Reconcile".into(), "Succeeded".into())),
            hibernation_enabled: false,
            is_hibernated: false,
            deletion_timestamp: false,
            workers: vec![WorkerPool::new(crate::shoot::DEFAULT_POOL)],
            node_monitor_grace_period: None,
        }
    }
}

impl ShootState {
    /// Default state with these pools (default node conditions).
    pub fn with_pools<S: AsRef<str>>(pools: &[S]) -> Self {
        ShootState {
            workers: pools.iter().map(|p| WorkerPool::new(p.as_ref())).collect(),
            ..Default::default()
        }
    }

    /// The Shoot object (`core.gardener.cloud/v1beta1`) of this state.
    pub fn to_shoot_json(&self, project: &str, name: &str) -> Value {
        let workers: Vec<Value> = self
            .workers
            .iter()
            .map(|w| {
                let mut worker = json!({"name": w.name, "machine": {"type": "local"},
                                        "minimum": 1, "maximum": 100});
                if let Some(conds) = &w.node_conditions {
                    worker["machineControllerManager"] = json!({"nodeConditions": conds});
                }
                worker
            })
            .collect();
        let mut kcm = json!({});
        if let Some(g) = &self.node_monitor_grace_period {
            kcm["nodeMonitorGracePeriod"] = json!(g);
        }
        let mut metadata = json!({"name": name, "namespace": format!("garden-{project}")});
        if self.deletion_timestamp {
            metadata["deletionTimestamp"] = json!(k8s_time(Utc::now()));
        }
        let mut status = json!({"isHibernated": self.is_hibernated});
        if let Some((type_, state)) = &self.last_operation {
            status["lastOperation"] = json!({
                "type": type_, "state": state, "progress": 100,
                "lastUpdateTime": k8s_time(Utc::now()),
                "description": "simulated by dwd-sim"
            });
        }
        json!({
            "apiVersion": "core.gardener.cloud/v1beta1", "kind": "Shoot",
            "metadata": metadata,
            "spec": {
                "hibernation": {"enabled": self.hibernation_enabled},
                "provider": {"type": "local", "workers": workers},
                "kubernetes": {"version": "1.34.4", "kubeControllerManager": kcm},
                "cloudProfileName": "local",
                "region": "local",
                "seedName": "seed"
            },
            "status": status
        })
    }
}

/// How the endpoints of a simulated EndpointSlice look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointsState {
    /// Every endpoint `ready: true`.
    AllReady,
    /// Every endpoint `ready: false`.
    NotReady,
    /// The first `k` endpoints ready, the rest not.
    PartlyReady(usize),
    /// No endpoints at all.
    Empty,
}

/// The control-plane objects of one shoot in the seed.
#[derive(Clone)]
pub struct SeedControlPlane {
    client: kube::Client,
    namespace: String,
}

impl SeedControlPlane {
    /// Works in shoot namespace `namespace` of the seed behind `client`.
    pub fn new(client: kube::Client, namespace: impl Into<String>) -> Self {
        SeedControlPlane {
            client,
            namespace: namespace.into(),
        }
    }

    /// The seed client.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The shoot namespace (also the Cluster's name).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn clusters(&self) -> Api<DynamicObject> {
        Api::all_with(self.client.clone(), &cluster_resource())
    }

    fn machines(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &self.namespace, &machine_resource())
    }

    /// Creates the shoot namespace (fine if it exists).
    pub async fn create_namespace(&self) -> Result<()> {
        let action = format!("create Namespace {}", self.namespace);
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": self.namespace}}))
            .map_err(json_err(&action))?;
        match Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_conflict(&e) => Ok(()),
            Err(e) => Err(kube_err(action)(e)),
        }
    }

    // --- probe secret -------------------------------------------------------------------

    /// Creates the probe Secret `name` with key `kubeconfig` = `kubeconfig`.
    pub async fn create_probe_secret(&self, name: &str, kubeconfig: &str) -> Result<()> {
        let action = format!("create Secret {}/{name}", self.namespace);
        let mut data = BTreeMap::new();
        data.insert(
            KUBECONFIG_KEY.to_string(),
            ByteString(kubeconfig.as_bytes().to_vec()),
        );
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            data: Some(data),
            type_: Some("Opaque".into()),
            ..Default::default()
        };
        self.api::<Secret>()
            .create(&PostParams::default(), &secret)
            .await
            .map_err(kube_err(action))?;
        Ok(())
    }

    /// Replaces the kubeconfig in the probe Secret (a credentials rotation).
    pub async fn rotate_probe_secret(&self, name: &str, kubeconfig: &str) -> Result<()> {
        self.set_secret_kubeconfig(name, kubeconfig.as_bytes(), "rotate")
            .await
    }

    /// Replaces the kubeconfig in the probe Secret with garbage that is no kubeconfig.
    pub async fn corrupt_probe_secret(&self, name: &str) -> Result<()> {
        self.set_secret_kubeconfig(name, b"\x00not: [a kubeconfig\n\xff", "corrupt")
            .await
    }

    async fn set_secret_kubeconfig(&self, name: &str, content: &[u8], what: &str) -> Result<()> {
        let action = format!("{what} Secret {}/{name}", self.namespace);
        let encoded =
            serde_json::to_value(ByteString(content.to_vec())).map_err(json_err(&action))?;
        let patch = json!({"data": {KUBECONFIG_KEY: encoded}});
        self.api::<Secret>()
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(kube_err(action))?;
        Ok(())
    }

    /// Deletes the probe Secret.
    pub async fn delete_probe_secret(&self, name: &str) -> Result<()> {
        self.api::<Secret>()
            .delete(name, &DeleteParams::default())
            .await
            .map_err(kube_err(format!("delete Secret {}/{name}", self.namespace)))?;
        Ok(())
    }

    // --- cluster ------------------------------------------------------------------------

    fn shoot_json(&self, state: &ShootState) -> Value {
        let (project, name) = shoot_name_of(&self.namespace);
        state.to_shoot_json(&project, &name)
    }

    /// Creates the `Cluster` named like the namespace, with the Shoot of `state`.
    pub async fn create_cluster(&self, state: &ShootState) -> Result<()> {
        let action = format!("create Cluster {}", self.namespace);
        create_json(
            &self.clusters(),
            json!({
                "apiVersion": format!("{}/{}", CLUSTER.group, CLUSTER.version), "kind": CLUSTER.kind,
                "metadata": {"name": self.namespace},
                "spec": {
                    "shoot": self.shoot_json(state),
                    "seed": {
                        "apiVersion": "core.gardener.cloud/v1beta1", "kind": "Seed",
                        "metadata": {"name": "seed"},
                        "spec": {"provider": {"type": "local", "region": "local"},
                                 "ingress": {"domain": "ingress.local.invalid"}}
                    },
                    "cloudProfile": {
                        "apiVersion": "core.gardener.cloud/v1beta1", "kind": "CloudProfile",
                        "metadata": {"name": "local"},
                        "spec": {"type": "local",
                                 "kubernetes": {"versions": [{"version": "1.34.4"}]},
                                 "regions": [{"name": "local"}]}
                    }
                }
            }),
            action,
        )
        .await?;
        Ok(())
    }

    /// Replaces the Cluster's `spec.shoot` with the Shoot of `state` (read-modify-write,
    /// retried on conflicts: a merge patch could not drop fields such as
    /// `deletionTimestamp`, and kube here has no JSON-patch support).
    pub async fn set_shoot_state(&self, state: &ShootState) -> Result<()> {
        let action = format!("update spec.shoot of Cluster {}", self.namespace);
        let api = self.clusters();
        let shoot = self.shoot_json(state);
        for attempt in 1..=CONFLICT_RETRIES {
            let mut cluster = api.get(&self.namespace).await.map_err(kube_err(&action))?;
            match cluster.data.get_mut("spec").and_then(Value::as_object_mut) {
                Some(spec) => {
                    spec.insert("shoot".into(), shoot.clone());
                }
                None => {
                    return Err(SimError::Unexpected {
                        action,
                        detail: "the Cluster has no spec".into(),
                    });
                }
            }
            match api
                .replace(&self.namespace, &PostParams::default(), &cluster)
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if is_conflict(&e) && attempt < CONFLICT_RETRIES => continue,
                Err(e) => return Err(kube_err(action)(e)),
            }
        }
        Err(SimError::Unexpected {
            action,
            detail: format!("still conflicting after {CONFLICT_RETRIES} attempts"),
        })
    }

    /// The Cluster's `spec.shoot` as stored.
    pub async fn cluster_shoot(&self) -> Result<Value> {
        let action = format!("get Cluster {}", self.namespace);
        let cluster = self
            .clusters()
            .get(&self.namespace)
            .await
            .map_err(kube_err(&action))?;
        cluster
            .data
            .get("spec")
            .and_then(|s| s.get("shoot"))
            .cloned()
            .ok_or_else(|| SimError::Unexpected {
                action,
                detail: "no spec.shoot".into(),
            })
    }

    /// Deletes the Cluster (the shoot is gone). Note: deleting the namespace itself would
    /// leave it `Terminating` forever, as no namespace controller runs.
    pub async fn delete_cluster(&self) -> Result<()> {
        self.clusters()
            .delete(&self.namespace, &DeleteParams::default())
            .await
            .map_err(kube_err(format!("delete Cluster {}", self.namespace)))?;
        Ok(())
    }

    // --- machines -----------------------------------------------------------------------

    /// Creates one Machine per node (`machine-<node>`, label `node=<node>`) in `phase`.
    pub async fn create_machines(&self, nodes: &[String], phase: &str) -> Result<()> {
        futures::stream::iter(nodes.iter().map(Ok))
            .try_for_each_concurrent(CREATE_CONCURRENCY, |node| self.create_machine(node, phase))
            .await
    }

    /// Creates the Machine of `node` and writes its phase.
    pub async fn create_machine(&self, node: &str, phase: &str) -> Result<()> {
        let name = machine_name(node);
        let action = format!("create Machine {}/{name}", self.namespace);
        create_json(&self.machines(), json!({
            "apiVersion": format!("{}/{}", MACHINE.group, MACHINE.version), "kind": MACHINE.kind,
            "metadata": {"name": name, "labels": {"node": node}},
            "spec": {"class": {"kind": "MachineClass", "name": "local"}, "providerID": format!("local:///{node}")}
        }), action).await?;
        // The status subresource ignores status on create: write it separately.
        self.set_machine_phase(node, phase).await
    }

    /// Sets `status.currentStatus.phase` of the Machine of `node` (e.g. `Failed`).
    pub async fn set_machine_phase(&self, node: &str, phase: &str) -> Result<()> {
        let name = machine_name(node);
        let action = format!("set phase {phase} on Machine {}/{name}", self.namespace);
        let patch = json!({"status": {
            "node": node,
            "currentStatus": {"phase": phase, "lastUpdateTime": k8s_time(Utc::now())}
        }});
        self.machines()
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(kube_err(action))?;
        Ok(())
    }

    /// The Machine phase of `node`; `None` when the Machine or its phase is missing.
    pub async fn machine_phase(&self, node: &str) -> Result<Option<String>> {
        let name = machine_name(node);
        let machine = self
            .machines()
            .get_opt(&name)
            .await
            .map_err(kube_err(format!("get Machine {}/{name}", self.namespace)))?;
        Ok(machine.and_then(|m| {
            m.data
                .pointer("/status/currentStatus/phase")
                .and_then(Value::as_str)
                .map(str::to_string)
        }))
    }

    /// Deletes the Machine of `node`.
    pub async fn delete_machine(&self, node: &str) -> Result<()> {
        let name = machine_name(node);
        self.machines()
            .delete(&name, &DeleteParams::default())
            .await
            .map_err(kube_err(format!(
                "delete Machine {}/{name}",
                self.namespace
            )))?;
        Ok(())
    }

    // --- deployments --------------------------------------------------------------------

    /// Creates these Deployments `(name, replicas)`.
    pub async fn create_deployments(&self, deployments: &[(String, i32)]) -> Result<()> {
        futures::stream::iter(deployments.iter().map(Ok))
            .try_for_each_concurrent(CREATE_CONCURRENCY, |(name, replicas)| {
                self.create_deployment(name, *replicas)
            })
            .await
    }

    /// Creates a Deployment whose pods never run (nothing schedules them); its status
    /// changes only through a [`crate::DeploymentStatusSim`].
    pub async fn create_deployment(&self, name: &str, replicas: i32) -> Result<()> {
        let action = format!("create Deployment {}/{name}", self.namespace);
        create_json(
            &self.api::<Deployment>(),
            json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "labels": {"app": name}},
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": {"app": name}},
                    "template": {
                        "metadata": {"labels": {"app": name}},
                        "spec": {"containers": [{"name": CONTAINER, "image": IMAGE}]}
                    }
                }
            }),
            action,
        )
        .await?;
        Ok(())
    }

    /// Reads a Deployment.
    pub async fn deployment(&self, name: &str) -> Result<Deployment> {
        self.api::<Deployment>()
            .get(name)
            .await
            .map_err(kube_err(format!(
                "get Deployment {}/{name}",
                self.namespace
            )))
    }

    /// Sets (`Some`) or removes (`None`) an annotation of a Deployment, e.g.
    /// `dependency-watchdog.gardener.cloud/ignore-scaling`.
    pub async fn set_deployment_annotation(
        &self,
        name: &str,
        key: &str,
        value: Option<&str>,
    ) -> Result<()> {
        let action = format!(
            "set annotation {key}={value:?} on Deployment {}/{name}",
            self.namespace
        );
        let patch = json!({"metadata": {"annotations": {key: value}}});
        self.api::<Deployment>()
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(kube_err(action))?;
        Ok(())
    }

    /// Sets `spec.replicas` of a Deployment through its scale subresource.
    pub async fn scale_deployment(&self, name: &str, replicas: i32) -> Result<()> {
        let patch = json!({"spec": {"replicas": replicas}});
        self.api::<Deployment>()
            .patch_scale(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(kube_err(format!(
                "scale Deployment {}/{name} to {replicas}",
                self.namespace
            )))?;
        Ok(())
    }

    // --- pods ---------------------------------------------------------------------------

    /// Creates a pod with these labels whose container waits in `CrashLoopBackOff`.
    pub async fn create_crashlooping_pod(&self, name: &str, labels: &[(&str, &str)]) -> Result<()> {
        self.create_pod(name, labels, true).await
    }

    /// Creates a pod with these labels whose container runs and is ready.
    pub async fn create_running_pod(&self, name: &str, labels: &[(&str, &str)]) -> Result<()> {
        self.create_pod(name, labels, false).await
    }

    /// Creates a pod, then writes its status (the apiserver resets Pod status on create).
    pub async fn create_pod(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        crashlooping: bool,
    ) -> Result<()> {
        let action = format!("create Pod {}/{name}", self.namespace);
        let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
        create_json(
            &self.api::<Pod>(),
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "labels": labels},
                "spec": {"containers": [{"name": CONTAINER, "image": IMAGE}],
                         // Deletes are immediate anyway (never scheduled); keep it short regardless.
                         "terminationGracePeriodSeconds": 0}
            }),
            action,
        )
        .await?;
        self.set_crashlooping(name, crashlooping).await
    }

    /// Makes the pod's container wait in `CrashLoopBackOff` (`true`) or run ready (`false`),
    /// through the status subresource.
    pub async fn set_crashlooping(&self, pod: &str, crashlooping: bool) -> Result<()> {
        let now = k8s_time(Utc::now());
        // Merge patch replaces the whole containerStatuses list, so the old state is gone.
        let (ready, container) = if crashlooping {
            (
                "False",
                json!({
                    "name": CONTAINER, "image": IMAGE, "imageID": "", "ready": false,
                    "started": false, "restartCount": 5,
                    "state": {"waiting": {"reason": "CrashLoopBackOff",
                              "message": "back-off 5m0s restarting failed container (simulated)"}},
                    "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                                  "startedAt": now, "finishedAt": now}}
                }),
            )
        } else {
            (
                "True",
                json!({
                    "name": CONTAINER, "image": IMAGE, "imageID": "", "ready": true,
                    "started": true, "restartCount": 0,
                    "state": {"running": {"startedAt": now}}
                }),
            )
        };
        let patch = json!({"status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": now}],
            "containerStatuses": [container]
        }});
        self.api::<Pod>()
            .patch_status(pod, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(kube_err(format!(
                "set crashlooping={crashlooping} on Pod {}/{pod}",
                self.namespace
            )))?;
        Ok(())
    }

    // --- endpoint slices ----------------------------------------------------------------

    /// Creates or updates the EndpointSlice of `service` (label
    /// `kubernetes.io/service-name`, IPv4) with `n` endpoints in `state` (`n` is ignored for
    /// [`EndpointsState::Empty`]).
    pub async fn set_endpoint_slice(
        &self,
        service: &str,
        n: usize,
        state: EndpointsState,
    ) -> Result<()> {
        let name = endpoint_slice_name(service);
        let action = format!(
            "set EndpointSlice {}/{name} to {state:?} of {n}",
            self.namespace
        );
        let endpoints = endpoints_json(n, state);
        let api = self.api::<EndpointSlice>();
        // Merge patch replaces the endpoints list as a whole.
        let patch = json!({"endpoints": endpoints});
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(kube_err(action)(e)),
        }
        create_json(
            &api,
            json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": name, "labels": {
                    SERVICE_NAME_LABEL: service,
                    "endpointslice.kubernetes.io/managed-by": "dwd-sim"
                }},
                "addressType": "IPv4",
                "endpoints": endpoints,
                "ports": [{"name": "https", "port": 443, "protocol": "TCP"}]
            }),
            action,
        )
        .await?;
        Ok(())
    }

    /// Deletes the EndpointSlice of `service`.
    pub async fn delete_endpoint_slice(&self, service: &str) -> Result<()> {
        let name = endpoint_slice_name(service);
        self.api::<EndpointSlice>()
            .delete(&name, &DeleteParams::default())
            .await
            .map_err(kube_err(format!(
                "delete EndpointSlice {}/{name}",
                self.namespace
            )))?;
        Ok(())
    }
}

/// `n` endpoints with addresses `10.200.x.y`, readiness per `state`.
fn endpoints_json(n: usize, state: EndpointsState) -> Vec<Value> {
    let n = if state == EndpointsState::Empty { 0 } else { n };
    (0..n)
        .map(|i| {
            let ready = match state {
                EndpointsState::AllReady => true,
                EndpointsState::NotReady | EndpointsState::Empty => false,
                EndpointsState::PartlyReady(k) => i < k,
            };
            json!({
                "addresses": [format!("10.200.{}.{}", (i / 250) % 250, i % 250 + 1)],
                "conditions": {"ready": ready, "serving": ready, "terminating": false}
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    //! The objects' JSON, without an apiserver.

    use super::*;

    #[test]
    fn shoot_name_comes_from_the_namespace() {
        assert_eq!(
            shoot_name_of("shoot--proj--my-shoot"),
            ("proj".into(), "my-shoot".into())
        );
        assert_eq!(shoot_name_of("other"), ("sim".into(), "other".into()));
    }

    #[test]
    fn shoot_json_has_the_fields_the_prober_reads() {
        let state = ShootState {
            workers: vec![WorkerPool {
                name: "a".into(),
                node_conditions: Some(vec!["KernelDeadlock".into()]),
            }],
            node_monitor_grace_period: Some("40s".into()),
            ..Default::default()
        };
        let shoot = state.to_shoot_json("p", "s");
        assert_eq!(shoot["metadata"]["namespace"], "garden-p");
        assert!(shoot["metadata"].get("deletionTimestamp").is_none());
        assert_eq!(shoot["status"]["lastOperation"]["progress"], 100);
        assert_eq!(
            shoot["spec"]["provider"]["workers"][0]["machineControllerManager"]["nodeConditions"],
            json!(["KernelDeadlock"])
        );
        assert_eq!(
            shoot["spec"]["kubernetes"]["kubeControllerManager"]["nodeMonitorGracePeriod"],
            "40s"
        );
    }

    #[test]
    fn endpoints_follow_the_state() {
        let ready = |v: Vec<Value>| -> Vec<bool> {
            v.iter()
                .map(|e| e["conditions"]["ready"].as_bool().unwrap_or_default())
                .collect()
        };
        assert_eq!(
            ready(endpoints_json(3, EndpointsState::AllReady)),
            [true; 3]
        );
        assert_eq!(
            ready(endpoints_json(2, EndpointsState::NotReady)),
            [false; 2]
        );
        assert_eq!(
            ready(endpoints_json(3, EndpointsState::PartlyReady(2))),
            [true, true, false]
        );
        assert!(endpoints_json(3, EndpointsState::Empty).is_empty());
        let many = endpoints_json(600, EndpointsState::AllReady);
        let distinct: std::collections::HashSet<String> =
            many.iter().map(|e| e["addresses"][0].to_string()).collect();
        assert_eq!(distinct.len(), 600, "addresses are unique");
    }
}
