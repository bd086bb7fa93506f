//! [`SimShoot`]: one whole simulated shoot — data plane, control-plane objects, kubelets.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::deployment_status::{DeploymentStatusOptions, DeploymentStatusSim};
use crate::kubelet_node::NodeShape;
use crate::seed::{
    DEFAULT_DEPLOYMENTS, DEFAULT_PROBE_SECRET, MACHINE_RUNNING, SeedControlPlane, ShootState,
};
use crate::shoot::{
    DEFAULT_POOL, KubeletOptions, Kubelets, NodeSpec, ShootDataPlane, node_specs_with_prefix,
};
use crate::{CREATE_CONCURRENCY, DEFAULT_RENEW_INTERVAL, Result};

/// What [`SimShoot::create`] makes. Start from [`SimShootOptions::new`] and change fields.
#[derive(Debug, Clone)]
pub struct SimShootOptions {
    /// Shoot namespace in the seed (`shoot--<project>--<name>`), also the Cluster's name.
    pub namespace: String,
    /// Number of nodes, named `<node_prefix>0 …` (ignored when `node_specs` is set).
    pub nodes: usize,
    /// Prefix of node names (default `node-`); distinct prefixes let shoots share an apiserver.
    pub node_prefix: String,
    /// Worker pools the nodes are spread over round-robin (default `["worker-a"]`).
    pub pools: Vec<String>,
    /// Explicit nodes, overriding `nodes`, `node_prefix` and `pools`.
    pub node_specs: Option<Vec<NodeSpec>>,
    /// [`NodeShape::KubeletSized`]: every node is made kubelet-sized, those of `node_specs`
    /// too. [`NodeShape::Small`] (the default) leaves each spec's own shape.
    pub node_shape: NodeShape,
    /// Kubelet lease renew interval (default 10 s).
    pub renew_interval: Duration,
    /// Lease renewals in flight at once for this shoot (default 16).
    pub kubelet_concurrency: usize,
    /// Optional limit on lease renewals shared with other shoots.
    pub renew_limiter: Option<Arc<Semaphore>>,
    /// Labels of every node Lease (default none; node labels go in `node_specs`).
    pub lease_labels: std::collections::BTreeMap<String, String>,
    /// Name of the probe Secret (default `shoot-access-dependency-watchdog-probe`).
    pub secret_name: String,
    /// Deployments `(name, replicas)` (default KCM 2, MCM 1, CA 1).
    pub deployments: Vec<(String, i32)>,
    /// Phase of every Machine at creation (default `Running`).
    pub machine_phase: String,
    /// The Shoot in the Cluster; `None`: reconciled, awake, one worker per pool in `pools`.
    pub shoot_state: Option<ShootState>,
    /// `Some(delay)`: run a [`DeploymentStatusSim`] for this namespace only (default
    /// `Some(0)`); `None`: run none (share one across shoots instead).
    pub deployment_status_delay: Option<Duration>,
}

impl SimShootOptions {
    /// Defaults for a shoot in `namespace`: 3 nodes in pool `worker-a`.
    pub fn new(namespace: impl Into<String>) -> Self {
        SimShootOptions {
            namespace: namespace.into(),
            nodes: 3,
            node_prefix: "node-".into(),
            pools: vec![DEFAULT_POOL.into()],
            node_specs: None,
            node_shape: NodeShape::Small,
            renew_interval: DEFAULT_RENEW_INTERVAL,
            kubelet_concurrency: CREATE_CONCURRENCY,
            renew_limiter: None,
            lease_labels: std::collections::BTreeMap::new(),
            secret_name: DEFAULT_PROBE_SECRET.into(),
            deployments: DEFAULT_DEPLOYMENTS
                .iter()
                .map(|(n, r)| (n.to_string(), *r))
                .collect(),
            machine_phase: MACHINE_RUNNING.into(),
            shoot_state: None,
            deployment_status_delay: Some(Duration::ZERO),
        }
    }

    /// Sets the number of nodes.
    pub fn with_nodes(mut self, nodes: usize) -> Self {
        self.nodes = nodes;
        self
    }

    /// Makes every node the size a real kubelet makes it (see [`NodeSpec::kubelet_sized`]):
    /// `SimShootOptions::new(ns).with_nodes(500).with_kubelet_sized_nodes()`.
    pub fn with_kubelet_sized_nodes(mut self) -> Self {
        self.node_shape = NodeShape::KubeletSized;
        self
    }

    /// Sets the renew interval.
    pub fn with_renew_interval(mut self, interval: Duration) -> Self {
        self.renew_interval = interval;
        self
    }

    /// The nodes these options describe.
    pub fn resolved_nodes(&self) -> Vec<NodeSpec> {
        let specs = match &self.node_specs {
            Some(specs) => specs.clone(),
            None => {
                let pools: Vec<&str> = self.pools.iter().map(String::as_str).collect();
                node_specs_with_prefix(&self.node_prefix, self.nodes, &pools)
            }
        };
        match self.node_shape {
            NodeShape::Small => specs,
            NodeShape::KubeletSized => specs.into_iter().map(NodeSpec::kubelet_sized).collect(),
        }
    }

    /// The shoot state these options describe.
    pub fn resolved_shoot_state(&self) -> ShootState {
        self.shoot_state.clone().unwrap_or_else(|| {
            let pools = if self.pools.is_empty() {
                vec![DEFAULT_POOL.to_string()]
            } else {
                self.pools.clone()
            };
            ShootState::with_pools(&pools)
        })
    }
}

/// One simulated shoot: its objects in the seed and the shoot apiserver, running kubelets,
/// and (optionally) its own Deployment status simulation. Dropping it stops the background
/// tasks; the objects stay.
pub struct SimShoot {
    seed: SeedControlPlane,
    shoot: ShootDataPlane,
    kubelets: Kubelets,
    deployment_status: Option<DeploymentStatusSim>,
    nodes: Vec<NodeSpec>,
    secret_name: String,
}

impl SimShoot {
    /// Creates everything and starts the kubelets: shoot namespace, probe Secret (holding
    /// `shoot_kubeconfig`), Cluster, Deployments, Machines in the seed; Nodes and Leases in
    /// the shoot. The Cluster comes last, after the objects a probe would read, so
    /// a watchdog reacting to it sees a complete shoot.
    pub async fn create(
        seed_client: kube::Client,
        shoot_client: kube::Client,
        shoot_kubeconfig: &str,
        options: SimShootOptions,
    ) -> Result<SimShoot> {
        let seed = SeedControlPlane::new(seed_client.clone(), &options.namespace);
        let shoot =
            ShootDataPlane::new(shoot_client).with_lease_labels(options.lease_labels.clone());
        let nodes = options.resolved_nodes();
        let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();

        seed.create_namespace().await?;
        // Start watching before creating Deployments so their first status comes quickly.
        let deployment_status = options.deployment_status_delay.map(|delay| {
            DeploymentStatusSim::start(
                seed_client,
                DeploymentStatusOptions::namespaces(&[&options.namespace]).with_delay(delay),
            )
        });
        seed.create_probe_secret(&options.secret_name, shoot_kubeconfig)
            .await?;
        seed.create_deployments(&options.deployments).await?;
        seed.create_machines(&names, &options.machine_phase).await?;
        shoot.create_nodes(&nodes).await?;
        let renewals = shoot.create_leases(&names).await?;
        let kubelets = shoot.start_kubelets(
            names,
            renewals,
            KubeletOptions {
                renew_interval: options.renew_interval,
                concurrency: options.kubelet_concurrency,
                limiter: options.renew_limiter.clone(),
            },
        );
        seed.create_cluster(&options.resolved_shoot_state()).await?;
        Ok(SimShoot {
            seed,
            shoot,
            kubelets,
            deployment_status,
            nodes,
            secret_name: options.secret_name,
        })
    }

    /// The control-plane objects in the seed.
    pub fn seed(&self) -> &SeedControlPlane {
        &self.seed
    }

    /// The shoot's Nodes and Leases.
    pub fn shoot(&self) -> &ShootDataPlane {
        &self.shoot
    }

    /// The running kubelets.
    pub fn kubelets(&self) -> &Kubelets {
        &self.kubelets
    }

    /// The Deployment status simulation of this shoot, if it runs one.
    pub fn deployment_status(&self) -> Option<&DeploymentStatusSim> {
        self.deployment_status.as_ref()
    }

    /// The shoot namespace (and Cluster name).
    pub fn namespace(&self) -> &str {
        self.seed.namespace()
    }

    /// The nodes as created.
    pub fn nodes(&self) -> &[NodeSpec] {
        &self.nodes
    }

    /// The node names, in order.
    pub fn node_names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.name.clone()).collect()
    }

    /// The probe Secret's name.
    pub fn secret_name(&self) -> &str {
        &self.secret_name
    }

    /// Replaces the Shoot in the Cluster.
    pub async fn set_shoot_state(&self, state: &ShootState) -> Result<()> {
        self.seed.set_shoot_state(state).await
    }

    /// Puts a new kubeconfig into the probe Secret.
    pub async fn rotate_probe_secret(&self, kubeconfig: &str) -> Result<()> {
        self.seed
            .rotate_probe_secret(&self.secret_name, kubeconfig)
            .await
    }

    /// Puts garbage into the probe Secret.
    pub async fn corrupt_probe_secret(&self) -> Result<()> {
        self.seed.corrupt_probe_secret(&self.secret_name).await
    }

    /// Deletes the probe Secret.
    pub async fn delete_probe_secret(&self) -> Result<()> {
        self.seed.delete_probe_secret(&self.secret_name).await
    }
}
