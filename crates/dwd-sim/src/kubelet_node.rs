//! Nodes the size a real kubelet makes them: [`NodeShape::KubeletSized`].
//!
//! A [`NodeSpec`] makes a small Node by default: the labels, annotations and conditions the
//! watchdog reads, a few hundred bytes. A real Node, as a kube-apiserver serves it in a list,
//! is 10–30 KiB of JSON, and that is what a watchdog decodes page by page when it lists a
//! shoot's nodes. The kubelet-sized shape writes what a node of a Gardener shoot on AWS
//! carries (modelled on `kubectl get node -o json --show-managed-fields` of such nodes, Garden
//! Linux with containerd, Calico, node-problem-detector, the EBS CSI driver):
//!
//! - `status.images`: 40–50 images (the kubelet reports at most 50, largest first), each with
//!   one to three `names` (`<repo>@sha256:<64 hex>` and the tags it was pulled as) and
//!   `sizeBytes`: the system components of a Gardener shoot (kube-proxy, Calico, CoreDNS,
//!   node-local-dns, the VPN client, the apiserver proxy, node-problem-detector, the CSI
//!   driver, node-exporter, …) and a tenant's workloads. About half of the served bytes.
//! - `managedFields`: written by the apiserver itself, because each part of the Node is written
//!   by its own field manager, as in a cluster: the `kubelet` creates the Node (labels,
//!   annotations, `spec.providerID`) and patches its status (addresses, capacity, allocatable,
//!   conditions, daemon endpoints, images, node info, runtime handlers, volumes in use);
//!   `node-problem-detector` and `calico-node` patch their conditions; `kube-controller-manager`
//!   sets the TTL annotation and the pod CIDR (and `status.volumesAttached` when the node has
//!   volumes); `machine-controller-manager` records the labels it applied and
//!   `gardener-node-agent` the checksum of the cloud config. Seven or eight writes per node,
//!   and as many `managedFields` entries (the kubelet's two: one for the Node, one for
//!   `status`), about 5 KiB of the served node.
//! - Conditions with a realistic reason, message and times: the kubelet's `MemoryPressure`,
//!   `DiskPressure`, `PIDPressure`; node-problem-detector's `KernelDeadlock`,
//!   `ReadonlyFilesystem`, `FrequentKubeletRestart`, `FrequentContainerdRestart`,
//!   `FrequentDockerRestart`, `FrequentUnregisterNetDevice`, `CorruptDockerOverlay2`,
//!   `KubeletProblem`, `ContainerRuntimeProblem`; Calico's `NetworkUnavailable`. All of them
//!   healthy (`False`), so none excludes a node from the lease probe (whose default unhealthy
//!   types are `KernelDeadlock`, `ReadonlyFilesystem`, `DiskPressure`, `NetworkUnavailable`).
//!
//! What the watchdog reads stays exactly as the spec says: the pool label, the zone label
//! (present only when the spec has one: no zone is made up), the spec's own labels and
//! annotations (which win over the realistic ones), and its conditions (type, status and
//! reason; a spec condition replaces the realistic one of its type; `Ready` comes from the spec
//! only). Everything else is a function of the node's name (and, for the instance type, its
//! pool) and the time of writing: the same spec written at the same time is the same JSON, in
//! every run ([`NodeSpec::node_json`]).
//!
//! Measured on the test environment's kube-apiserver (v1.34.4, 2 cores): 18.6–21.8 KiB per
//! node as served in a list (20.2 KiB on average, 5 KiB of it `managedFields`, 9 KiB images);
//! 20 nodes created in about a second, 500 in 11–19 s (the latter with a compiler busy on the
//! same cores), [`crate::CREATE_CONCURRENCY`] nodes at a time, each node's writes in turn.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Map, Value, json};

use crate::shoot::{HOSTNAME_LABEL, NodeSpec, POOL_LABEL, ZONE_LABEL};
use crate::{Result, json_err, k8s_time, kube_err};

/// How much a created Node carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NodeShape {
    /// Only the labels, annotations and conditions of the [`NodeSpec`]: a few hundred bytes.
    #[default]
    Small,
    /// What a kubelet and its neighbours write on a Gardener shoot's node: 10–30 KiB as
    /// served, with the `managedFields` of the six field managers that write a real node (see
    /// the module doc).
    KubeletSized,
}

/// Field manager of the kubelet, which creates the Node and writes most of its status.
pub const KUBELET_MANAGER: &str = "kubelet";
/// Field manager of node-problem-detector (its conditions).
pub const NODE_PROBLEM_DETECTOR_MANAGER: &str = "node-problem-detector";
/// Field manager of Calico's node agent (`NetworkUnavailable`).
pub const CALICO_NODE_MANAGER: &str = "calico-node";
/// Field manager of kube-controller-manager (TTL annotation, pod CIDR, attached volumes).
pub const KUBE_CONTROLLER_MANAGER: &str = "kube-controller-manager";
/// Field manager of machine-controller-manager (the labels it applied).
pub const MACHINE_CONTROLLER_MANAGER: &str = "machine-controller-manager";
/// Field manager of gardener-node-agent (the cloud config's checksum).
pub const GARDENER_NODE_AGENT_MANAGER: &str = "gardener-node-agent";

/// Kubernetes version of the simulated kubelets (the test environment's apiserver's).
const KUBELET_VERSION: &str = "v1.34.4";
/// Region of every kubelet-sized node.
const REGION: &str = "eu-west-1";
/// Zones of [`REGION`], for the provider ID of a node whose spec has no zone.
const REGION_ZONES: [&str; 3] = ["eu-west-1a", "eu-west-1b", "eu-west-1c"];
/// Garden Linux release of the machine image.
const IMAGE_VERSION: &str = "1592.9.0";
/// Annotation in which machine-controller-manager records the labels it applied.
const MCM_LAST_APPLIED_ANNOTATION: &str =
    "node.machine.sapcloud.io/last-applied-anno-labels-taints";
/// CSI driver of the node's volumes.
const CSI_DRIVER: &str = "ebs.csi.aws.com";

/// Instance types `(name, vCPUs, GiB of memory)`; a pool has one.
const INSTANCE_TYPES: [(&str, u64, u64); 6] = [
    ("m5.large", 2, 8),
    ("m5.xlarge", 4, 16),
    ("m5.2xlarge", 8, 32),
    ("m6i.xlarge", 4, 16),
    ("c5.2xlarge", 8, 16),
    ("r5.xlarge", 4, 32),
];

/// An image a node may hold: repository, the tags it may have been pulled as (the first is
/// the one a system component runs), and its size range in MB.
type CatalogImage = (&'static str, &'static [&'static str], u64, u64);

/// Images of a Gardener shoot's system components: on every node.
#[rustfmt::skip]
const SYSTEM_IMAGES: [CatalogImage; 20] = [
    ("registry.k8s.io/pause", &["3.10"], 1, 1),
    ("registry.k8s.io/kube-proxy", &["v1.34.4"], 30, 32),
    ("quay.io/calico/node", &["v3.29.3"], 150, 160),
    ("quay.io/calico/cni", &["v3.29.3"], 90, 100),
    ("quay.io/calico/typha", &["v3.29.3"], 30, 35),
    ("quay.io/calico/kube-controllers", &["v3.29.3"], 34, 38),
    ("quay.io/calico/pod2daemon-flexvol", &["v3.29.3"], 7, 8),
    ("registry.k8s.io/coredns/coredns", &["v1.12.1"], 20, 22),
    ("registry.k8s.io/dns/k8s-dns-node-cache", &["1.26.0"], 30, 34),
    ("registry.k8s.io/metrics-server/metrics-server", &["v0.7.2"], 19, 21),
    ("registry.k8s.io/node-problem-detector/node-problem-detector", &["v0.8.21"], 60, 70),
    ("registry.k8s.io/sig-storage/csi-node-driver-registrar", &["v2.13.0"], 10, 12),
    ("registry.k8s.io/sig-storage/livenessprobe", &["v2.15.0"], 10, 12),
    ("registry.k8s.io/provider-aws/aws-ebs-csi-driver", &["v1.41.0"], 45, 50),
    ("quay.io/prometheus/node-exporter", &["v1.9.1"], 11, 13),
    ("quay.io/prometheus/blackbox-exporter", &["v0.26.0"], 11, 13),
    ("europe-docker.pkg.dev/gardener-project/releases/gardener/vpn-client", &["0.36.0"], 20, 25),
    ("europe-docker.pkg.dev/gardener-project/releases/3rd/envoyproxy/envoy-distroless", &["v1.33.2"], 40, 45),
    ("europe-docker.pkg.dev/gardener-project/releases/gardener/apiserver-proxy", &["v0.18.0"], 12, 15),
    ("europe-docker.pkg.dev/gardener-project/releases/gardener/network-problem-detector", &["v0.26.0"], 25, 30),
];

/// Images a node may hold besides: older system images and a tenant's workloads.
#[rustfmt::skip]
const OTHER_IMAGES: [CatalogImage; 44] = [
    ("eu.gcr.io/gardener-project/gardener/vpn-shoot-client", &["0.22.0", "0.21.1"], 20, 25),
    ("eu.gcr.io/gardener-project/gardener/apiserver-proxy-sidecar", &["v0.13.0", "v0.12.1"], 12, 15),
    ("eu.gcr.io/gardener-project/gardener/network-problem-detector", &["v0.17.0", "v0.16.0"], 25, 30),
    ("eu.gcr.io/gardener-project/gardener/ops-toolbelt", &["0.26.0", "latest"], 180, 260),
    ("eu.gcr.io/gardener-project/gardener/egress-filter-refresher", &["v0.3.0"], 30, 40),
    ("europe-docker.pkg.dev/gardener-project/releases/gardener/node-agent", &["v1.114.1"], 40, 50),
    ("europe-docker.pkg.dev/gardener-project/releases/gardener/extensions/registry-cache", &["v0.14.0"], 20, 25),
    ("europe-docker.pkg.dev/gardener-project/releases/gardener/ops-toolbelt", &["0.30.0", "latest"], 200, 280),
    ("registry.k8s.io/kube-proxy", &["v1.33.7", "v1.32.11"], 30, 32),
    ("registry.k8s.io/cpa/cluster-proportional-autoscaler", &["v1.9.0"], 15, 17),
    ("registry.k8s.io/ingress-nginx/controller", &["v1.12.1", "v1.11.5"], 100, 110),
    ("registry.k8s.io/ingress-nginx/kube-webhook-certgen", &["v1.5.2"], 25, 28),
    ("quay.io/jetstack/cert-manager-controller", &["v1.17.1", "v1.16.3"], 18, 22),
    ("quay.io/jetstack/cert-manager-webhook", &["v1.17.1"], 15, 18),
    ("quay.io/jetstack/cert-manager-cainjector", &["v1.17.1"], 14, 17),
    ("quay.io/prometheus/prometheus", &["v3.2.1", "v2.55.1"], 120, 140),
    ("quay.io/prometheus/alertmanager", &["v0.28.1"], 30, 35),
    ("quay.io/argoproj/argocd", &["v2.14.7", "v2.13.4"], 180, 200),
    ("ghcr.io/fluxcd/source-controller", &["v1.5.0"], 45, 55),
    ("ghcr.io/fluxcd/kustomize-controller", &["v1.5.1"], 40, 45),
    ("ghcr.io/fluxcd/helm-controller", &["v1.2.0"], 40, 50),
    ("docker.io/library/nginx", &["1.27.4", "1.27-alpine", "stable"], 45, 70),
    ("docker.io/library/redis", &["7.4.2", "7.4-alpine"], 15, 45),
    ("docker.io/library/postgres", &["16.8", "17.4", "16-alpine"], 100, 160),
    ("docker.io/library/python", &["3.12-slim", "3.13-slim", "3.12"], 45, 400),
    ("docker.io/library/busybox", &["1.37", "latest"], 2, 3),
    ("docker.io/library/alpine", &["3.21", "3.20", "latest"], 3, 4),
    ("docker.io/library/golang", &["1.24", "1.23"], 280, 300),
    ("docker.io/library/node", &["22-alpine", "20-slim"], 50, 90),
    ("docker.io/library/eclipse-temurin", &["21-jre", "17-jre"], 90, 110),
    ("docker.io/library/mongo", &["8.0.5", "7.0.17"], 250, 290),
    ("docker.io/library/mysql", &["8.4.4"], 170, 180),
    ("docker.io/library/rabbitmq", &["4.0.7-management", "3.13-management"], 100, 120),
    ("docker.io/bitnami/kafka", &["3.9.0", "3.8.1"], 160, 180),
    ("docker.io/grafana/grafana", &["11.5.2", "11.4.0"], 120, 140),
    ("docker.io/fluent/fluent-bit", &["3.2.8", "3.1.9"], 35, 40),
    ("docker.io/otel/opentelemetry-collector-contrib", &["0.121.0"], 95, 110),
    ("docker.io/hashicorp/vault", &["1.19.0"], 130, 150),
    ("docker.io/istio/proxyv2", &["1.25.0", "1.24.3"], 90, 100),
    ("ghcr.io/example-org/shop/checkout-service", &["2025.03.1", "2025.02.4"], 60, 90),
    ("ghcr.io/example-org/shop/orders-api", &["v4.12.0", "v4.11.3"], 70, 100),
    ("ghcr.io/example-org/shop/payments-gateway", &["1.38.2"], 80, 120),
    ("ghcr.io/example-org/shop/catalog-indexer", &["0.19.7"], 150, 220),
    ("ghcr.io/example-org/shop/frontend", &["2025.03.12-7f3c2a1"], 40, 60),
];

/// Fewest and most images a kubelet-sized node reports (the kubelet's `nodeStatusMaxImages`
/// is 50).
const IMAGES: (u64, u64) = (40, 50);

/// Conditions `(type, reason, message, owner)` of a healthy node besides `Ready`, all `False`.
#[rustfmt::skip]
const HEALTHY_CONDITIONS: [(&str, &str, &str, &str); 13] = [
    ("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available", KUBELET_MANAGER),
    ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure", KUBELET_MANAGER),
    ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available", KUBELET_MANAGER),
    ("KernelDeadlock", "KernelHasNoDeadlock", "kernel has no deadlock", NODE_PROBLEM_DETECTOR_MANAGER),
    ("ReadonlyFilesystem", "FilesystemIsNotReadOnly", "Filesystem is not read-only", NODE_PROBLEM_DETECTOR_MANAGER),
    ("FrequentKubeletRestart", "NoFrequentKubeletRestart", "kubelet is functioning properly", NODE_PROBLEM_DETECTOR_MANAGER),
    ("FrequentContainerdRestart", "NoFrequentContainerdRestart", "containerd is functioning properly", NODE_PROBLEM_DETECTOR_MANAGER),
    ("FrequentDockerRestart", "NoFrequentDockerRestart", "docker is functioning properly", NODE_PROBLEM_DETECTOR_MANAGER),
    ("FrequentUnregisterNetDevice", "NoFrequentUnregisterNetDevice", "node is functioning properly", NODE_PROBLEM_DETECTOR_MANAGER),
    ("CorruptDockerOverlay2", "NoCorruptDockerOverlay2", "docker overlay2 is functioning properly", NODE_PROBLEM_DETECTOR_MANAGER),
    ("KubeletProblem", "KubeletIsUp", "kubelet service is up", NODE_PROBLEM_DETECTOR_MANAGER),
    ("ContainerRuntimeProblem", "ContainerRuntimeIsUp", "container runtime service is up", NODE_PROBLEM_DETECTOR_MANAGER),
    ("NetworkUnavailable", "CalicoIsUp", "Calico is running on this node", CALICO_NODE_MANAGER),
];

/// `Ready=True` as the kubelet reports it.
const READY: (&str, &str, &str) = ("Ready", "KubeletReady", "kubelet is posting ready status");

/// A deterministic pseudo-random sequence (SplitMix64) seeded from a string (FNV-1a): the same
/// name gives the same node in every run and with every version of every crate.
struct Seeded(u64);

impl Seeded {
    fn new(seed: &str) -> Self {
        let hash = seed.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        Seeded(hash)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi.saturating_sub(lo) + 1)
    }

    /// Whether an event of `percent` % probability happens.
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    /// `len` lower-case hex digits.
    fn hex(&mut self, len: usize) -> String {
        let mut s = String::with_capacity(len + 16);
        while s.len() < len {
            s.push_str(&format!("{:016x}", self.next()));
        }
        s.truncate(len);
        s
    }

    /// A UUID-shaped string (`8-4-4-4-12` hex digits) starting with `prefix`.
    fn uuid(&mut self, prefix: &str) -> String {
        let hex = format!("{prefix}{}", self.hex(32 - prefix.len().min(32)));
        format!(
            "{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        )
    }

    /// One of `items` (`None` only when it is empty).
    fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        let n = u64::try_from(items.len()).ok()?;
        let i = usize::try_from(self.next() % n.max(1)).ok()?;
        items.get(i)
    }
}

/// Which request writes a part of the Node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// `POST /api/v1/nodes`.
    Create,
    /// A merge patch of the Node (metadata, spec).
    Node,
    /// A strategic merge patch of `status` (conditions merge by type).
    Status,
}

/// One write of a kubelet-sized node, by one field manager.
#[derive(Debug, Clone)]
struct NodeWrite {
    manager: &'static str,
    target: Target,
    body: Value,
}

/// What a node's name (and pool) decide about it.
struct Facts {
    instance_type: &'static str,
    cpus: u64,
    memory_kib: u64,
    disk_kib: u64,
    ip: (u64, u64),
    instance_id: String,
    provider_zone: String,
    pod_cidr: String,
    boot: DateTime<Utc>,
    volumes: Vec<String>,
    images: Vec<Value>,
    machine_id: String,
    boot_id: String,
    system_uuid: String,
    kernel: String,
    cloud_config_checksum: String,
}

impl Facts {
    fn of(spec: &NodeSpec, now: DateTime<Utc>) -> Facts {
        let mut pool_rng = Seeded::new(&spec.pool);
        let (instance_type, cpus, gib) = pool_rng
            .pick(&INSTANCE_TYPES)
            .copied()
            .unwrap_or(INSTANCE_TYPES[1]);
        let mut rng = Seeded::new(&spec.name);
        let memory_kib = gib * 1024 * 1024 - rng.range(150_000, 450_000);
        let disk_kib = *rng
            .pick(&[50_620_216_u64, 82_083_224, 102_687_672])
            .unwrap_or(&50_620_216);
        let ip = (rng.range(0, 255), rng.range(1, 254));
        let instance_id = format!("i-0{}", rng.hex(16));
        let provider_zone = match spec.labels.get(ZONE_LABEL) {
            Some(zone) => zone.clone(),
            None => rng
                .pick(&REGION_ZONES)
                .unwrap_or(&REGION_ZONES[0])
                .to_string(),
        };
        let pod_cidr = format!("100.{}.{}.0/24", rng.range(96, 127), rng.range(0, 255));
        let age_seconds = i64::try_from(rng.range(2 * 3600, 21 * 24 * 3600)).unwrap_or(3600);
        let boot = now - Duration::seconds(age_seconds);
        // Half the nodes have no volume; the others one to three.
        let volumes = (0..if rng.chance(50) { 0 } else { rng.range(1, 3) })
            .map(|_| format!("kubernetes.io/csi/{CSI_DRIVER}^vol-0{}", rng.hex(16)))
            .collect();
        let images = images(&mut rng);
        Facts {
            instance_type,
            cpus,
            memory_kib,
            disk_kib,
            ip,
            instance_id,
            provider_zone,
            pod_cidr,
            boot,
            volumes,
            images,
            machine_id: rng.hex(32),
            boot_id: rng.uuid(""),
            system_uuid: rng.uuid("ec2"),
            kernel: format!("6.6.{}-cloud-amd64", rng.range(78, 84)),
            cloud_config_checksum: rng.hex(64),
        }
    }

    fn internal_ip(&self) -> String {
        format!("10.250.{}.{}", self.ip.0, self.ip.1)
    }
}

/// The images a node reports: every system image and enough others for 40–50, largest first.
fn images(rng: &mut Seeded) -> Vec<Value> {
    let count = usize::try_from(rng.range(IMAGES.0, IMAGES.1)).unwrap_or(50);
    let mut others: Vec<&CatalogImage> = OTHER_IMAGES.iter().collect();
    // Fisher–Yates, seeded.
    for i in (1..others.len()).rev() {
        let j = usize::try_from(rng.next() % (i as u64 + 1)).unwrap_or(0);
        others.swap(i, j);
    }
    let extra = count.saturating_sub(SYSTEM_IMAGES.len());
    let mut chosen: Vec<(u64, Value)> = SYSTEM_IMAGES
        .iter()
        .map(|image| (image, true))
        .chain(others.into_iter().take(extra).map(|image| (image, false)))
        .map(|((repo, tags, min_mb, max_mb), system)| {
            let tag = if system { tags.first() } else { rng.pick(tags) };
            let tag = tag.copied().unwrap_or("latest");
            let size = rng.range(*min_mb * 1_000_000, *max_mb * 1_000_000 + 999_999);
            let mut names = vec![format!("{repo}@sha256:{}", rng.hex(64))];
            let by_digest_only = !system && rng.chance(10);
            if !by_digest_only {
                names.push(format!("{repo}:{tag}"));
                if let Some(other) = tags.iter().find(|t| **t != tag)
                    && rng.chance(20)
                {
                    names.push(format!("{repo}:{other}"));
                }
            }
            (size, json!({"names": names, "sizeBytes": size}))
        })
        .collect();
    chosen.sort_by_key(|(size, _)| std::cmp::Reverse(*size));
    chosen.into_iter().map(|(_, image)| image).collect()
}

/// One condition as its owner writes it.
fn condition(
    (type_, status, reason): (&str, &str, &str),
    message: &str,
    heartbeat: DateTime<Utc>,
    transition: DateTime<Utc>,
) -> Value {
    json!({
        "type": type_, "status": status, "reason": reason, "message": message,
        "lastHeartbeatTime": k8s_time(heartbeat), "lastTransitionTime": k8s_time(transition)
    })
}

/// The node's conditions `(owner, (type, status, reason), message)`: the realistic healthy
/// ones, each replaced by the spec's condition of its type, then the spec's others (`Ready`
/// among them) in the spec's order.
fn conditions(spec: &NodeSpec) -> Vec<(&'static str, (String, String, String), String)> {
    let spec_of = |type_: &str| spec.conditions.iter().find(|(t, _, _)| t == type_);
    let mut out: Vec<_> = HEALTHY_CONDITIONS
        .iter()
        .map(|&(type_, reason, message, owner)| match spec_of(type_) {
            Some(c) => (owner, c.clone(), spec_message(c, message, "False", reason)),
            None => (
                owner,
                (type_.into(), "False".into(), reason.into()),
                message.into(),
            ),
        })
        .collect();
    for c in &spec.conditions {
        if HEALTHY_CONDITIONS.iter().any(|h| h.0 == c.0) {
            continue;
        }
        let (owner, message) = if c.0 == READY.0 {
            (KUBELET_MANAGER, spec_message(c, READY.2, "True", READY.1))
        } else {
            // Not a type a kubelet or its neighbours write: the spec's own, owned by the
            // kubelet's create (as the small shape has it).
            ("", format!("simulated by dwd-sim: {}={}", c.0, c.1))
        };
        out.push((owner, c.clone(), message));
    }
    out
}

/// The realistic message when the spec's condition is the realistic one, else the small
/// shape's.
fn spec_message(c: &(String, String, String), message: &str, status: &str, reason: &str) -> String {
    if c.1 == status && c.2 == reason {
        message.into()
    } else {
        format!("simulated by dwd-sim: {}={}", c.0, c.1)
    }
}

/// The labels: the realistic ones, then the spec's, then pool and host name (as the small
/// shape). The zone labels only when the spec has a zone.
fn labels(spec: &NodeSpec, facts: &Facts) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = [
        ("beta.kubernetes.io/arch", "amd64"),
        ("beta.kubernetes.io/instance-type", facts.instance_type),
        ("beta.kubernetes.io/os", "linux"),
        ("failure-domain.beta.kubernetes.io/region", REGION),
        ("kubernetes.io/arch", "amd64"),
        ("kubernetes.io/os", "linux"),
        ("networking.gardener.cloud/node-local-dns-enabled", "true"),
        ("node.kubernetes.io/instance-type", facts.instance_type),
        ("node.kubernetes.io/role", "node"),
        ("topology.kubernetes.io/region", REGION),
        ("worker.garden.sapcloud.io/group", &spec.pool),
        ("worker.gardener.cloud/cri-name", "containerd"),
        ("worker.gardener.cloud/image-name", "gardenlinux"),
        ("worker.gardener.cloud/image-version", IMAGE_VERSION),
        (
            "worker.gardener.cloud/kubernetes-version",
            KUBELET_VERSION.trim_start_matches('v'),
        ),
        ("worker.gardener.cloud/system-components", "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    if let Some(zone) = spec.labels.get(ZONE_LABEL) {
        labels.insert(
            "failure-domain.beta.kubernetes.io/zone".into(),
            zone.clone(),
        );
        labels.insert("topology.ebs.csi.aws.com/zone".into(), zone.clone());
    }
    labels.extend(spec.labels.clone());
    labels.insert(POOL_LABEL.into(), spec.pool.clone());
    labels.insert(HOSTNAME_LABEL.into(), spec.name.clone());
    labels
}

/// What the kubelet reports in its status besides conditions.
fn kubelet_status(spec: &NodeSpec, facts: &Facts) -> Map<String, Value> {
    let ip = facts.internal_ip();
    let dns = format!("ip-{}.{REGION}.compute.internal", ip.replace('.', "-"));
    // Gardener's kube-reserved (80m CPU, 1 GiB) and the eviction threshold (100 MiB).
    let allocatable_memory = facts.memory_kib.saturating_sub(1024 * 1024 + 100 * 1024);
    let allocatable_disk = facts.disk_kib * 1024 / 10 * 9;
    let handler_features = json!({"recursiveReadOnlyMounts": true, "userNamespaces": false});
    let mut status = json!({
        "addresses": [
            {"type": "InternalIP", "address": ip},
            {"type": "Hostname", "address": spec.name},
            {"type": "InternalDNS", "address": dns},
        ],
        "capacity": {
            "cpu": facts.cpus.to_string(),
            "ephemeral-storage": format!("{}Ki", facts.disk_kib),
            "hugepages-1Gi": "0", "hugepages-2Mi": "0",
            "memory": format!("{}Ki", facts.memory_kib),
            "pods": "110",
        },
        "allocatable": {
            "cpu": format!("{}m", facts.cpus * 1000 - 80),
            "ephemeral-storage": allocatable_disk.to_string(),
            "hugepages-1Gi": "0", "hugepages-2Mi": "0",
            "memory": format!("{allocatable_memory}Ki"),
            "pods": "110",
        },
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "features": {"supplementalGroupsPolicy": false},
        "images": facts.images,
        "nodeInfo": {
            "architecture": "amd64",
            "bootID": facts.boot_id,
            "containerRuntimeVersion": "containerd://1.7.27",
            "kernelVersion": facts.kernel,
            "kubeProxyVersion": "",
            "kubeletVersion": KUBELET_VERSION,
            "machineID": facts.machine_id,
            "operatingSystem": "linux",
            "osImage": format!("Garden Linux {}", IMAGE_VERSION.trim_end_matches(".0")),
            "systemUUID": facts.system_uuid,
        },
        "runtimeHandlers": [
            {"name": "", "features": handler_features},
            {"name": "runc", "features": handler_features},
        ],
    });
    if !facts.volumes.is_empty() {
        status["volumesInUse"] = json!(facts.volumes);
    }
    match status {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// The kubelet's create of the node: its labels, its annotations (the spec's on top of the
/// kubelet's, CSI's and attach-detach's), its provider ID and `status_conditions`. Status
/// written on create is kept for Nodes but owned by no one: owners come from the status writes
/// after it.
fn kubelet_create(spec: &NodeSpec, facts: &Facts, status_conditions: Vec<Value>) -> Value {
    let mut annotations: BTreeMap<String, String> = [
        ("alpha.kubernetes.io/provided-node-ip", facts.internal_ip()),
        (
            "csi.volume.kubernetes.io/nodeid",
            json!({CSI_DRIVER: facts.instance_id}).to_string(),
        ),
        (
            "volumes.kubernetes.io/controller-managed-attach-detach",
            "true".into(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    annotations.extend(spec.annotations.clone());
    let labels = labels(spec, facts);
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": spec.name, "labels": labels, "annotations": annotations},
        "spec": {
            "providerID": format!("aws:///{}/{}", facts.provider_zone, facts.instance_id),
        },
        "status": {"conditions": status_conditions},
    })
}

/// The machine-controller-manager's last-applied annotation: the labels it puts on the node.
fn mcm_last_applied(spec: &NodeSpec) -> Value {
    let mcm_labels: BTreeMap<&str, &str> = [
        ("node.kubernetes.io/role", "node"),
        ("worker.garden.sapcloud.io/group", spec.pool.as_str()),
        (POOL_LABEL, spec.pool.as_str()),
        ("worker.gardener.cloud/system-components", "true"),
    ]
    .into_iter()
    .collect();
    json!({
        "metadata": {"creationTimestamp": null, "labels": mcm_labels}, "spec": {}
    })
}

/// The kube-controller-manager's status write of the volumes attached to the node, if any.
fn volumes_attached(facts: &Facts) -> Option<NodeWrite> {
    if facts.volumes.is_empty() {
        return None;
    }
    let attached: Vec<Value> = facts
        .volumes
        .iter()
        .map(|v| json!({"name": v, "devicePath": ""}))
        .collect();
    Some(NodeWrite {
        manager: KUBE_CONTROLLER_MANAGER,
        target: Target::Status,
        body: json!({"status": {"volumesAttached": attached}}),
    })
}

/// The writes that make the kubelet-sized node of `spec` at `now`, in order: the kubelet's
/// create first; after it, each writer's patch.
fn writes(spec: &NodeSpec, now: DateTime<Utc>) -> Vec<NodeWrite> {
    let facts = Facts::of(spec, now);
    let registered = facts.boot + Duration::seconds(20);
    let conditions = conditions(spec);
    let transition = |owner: &str| match owner {
        NODE_PROBLEM_DETECTOR_MANAGER => facts.boot + Duration::seconds(35),
        CALICO_NODE_MANAGER => facts.boot + Duration::seconds(48),
        _ => registered,
    };
    // Calico writes its condition once, heartbeat and transition together.
    let heartbeat = |owner: &str| match owner {
        CALICO_NODE_MANAGER => transition(owner),
        _ => now,
    };
    let condition_of = |owner: &str,
                        (t, s, r): &(String, String, String),
                        message: &str,
                        heartbeat: DateTime<Utc>| {
        condition((t, s, r), message, heartbeat, transition(owner))
    };
    let owned_by = |manager: &str| -> Vec<Value> {
        conditions
            .iter()
            .filter(|(owner, _, _)| *owner == manager)
            .map(|(owner, c, message)| condition_of(owner, c, message, heartbeat(owner)))
            .collect()
    };

    // The kubelet registers the node with the spec's conditions (what the watchdog reads is
    // there from the first moment), its last heartbeat a while ago.
    let spec_conditions: Vec<Value> = conditions
        .iter()
        .filter(|(_, c, _)| spec.conditions.contains(c))
        .map(|(owner, c, message)| condition_of(owner, c, message, now - Duration::seconds(40)))
        .collect();
    let create = kubelet_create(spec, &facts, spec_conditions);

    let mut kubelet = kubelet_status(spec, &facts);
    kubelet.insert("conditions".into(), json!(owned_by(KUBELET_MANAGER)));
    let mut out = vec![
        NodeWrite {
            manager: KUBELET_MANAGER,
            target: Target::Create,
            body: create,
        },
        NodeWrite {
            manager: KUBELET_MANAGER,
            target: Target::Status,
            body: json!({"status": kubelet}),
        },
        NodeWrite {
            manager: NODE_PROBLEM_DETECTOR_MANAGER,
            target: Target::Status,
            body: json!({"status": {"conditions": owned_by(NODE_PROBLEM_DETECTOR_MANAGER)}}),
        },
        NodeWrite {
            manager: CALICO_NODE_MANAGER,
            target: Target::Status,
            body: json!({"status": {"conditions": owned_by(CALICO_NODE_MANAGER)}}),
        },
        NodeWrite {
            manager: KUBE_CONTROLLER_MANAGER,
            target: Target::Node,
            body: json!({
                "metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
                "spec": {"podCIDR": facts.pod_cidr, "podCIDRs": [facts.pod_cidr]},
            }),
        },
        NodeWrite {
            manager: MACHINE_CONTROLLER_MANAGER,
            target: Target::Node,
            body: json!({"metadata": {"annotations": {
                MCM_LAST_APPLIED_ANNOTATION: mcm_last_applied(spec).to_string()
            }}}),
        },
        NodeWrite {
            manager: GARDENER_NODE_AGENT_MANAGER,
            target: Target::Node,
            body: json!({"metadata": {"annotations": {
                "checksum/cloud-config-data": facts.cloud_config_checksum
            }}}),
        },
    ];
    out.extend(volumes_attached(&facts));
    out
}

/// The kubelet-sized Node of `spec` as its writers leave it at `now`: the writes merged the
/// way the apiserver merges them (merge patches; conditions merged by type).
pub(crate) fn node_json(spec: &NodeSpec, now: DateTime<Utc>) -> Value {
    let mut node = Value::Null;
    for write in writes(spec, now) {
        match write.target {
            Target::Create => node = write.body,
            Target::Node | Target::Status => merge(&mut node, &write.body),
        }
    }
    node
}

/// Merges `patch` into `target`: objects key by key (`null` deletes), `conditions` by type,
/// anything else replaced.
fn merge(target: &mut Value, patch: &Value) {
    let (Value::Object(target), Value::Object(patch)) = (&mut *target, patch) else {
        *target = patch.clone();
        return;
    };
    for (key, value) in patch {
        match (target.get_mut(key), value) {
            (_, Value::Null) => {
                target.remove(key);
            }
            (Some(Value::Array(existing)), Value::Array(new)) if key == "conditions" => {
                for c in new {
                    match existing.iter_mut().find(|e| e["type"] == c["type"]) {
                        Some(slot) => merge(slot, c),
                        None => existing.push(c.clone()),
                    }
                }
            }
            (Some(slot @ Value::Object(_)), Value::Object(_)) => merge(slot, value),
            _ => {
                target.insert(key.clone(), value.clone());
            }
        }
    }
}

/// Creates the kubelet-sized Node of `spec` through `api`: the kubelet's create, then every
/// other writer's patch, one after another.
pub(crate) async fn create(api: &Api<Node>, spec: &NodeSpec) -> Result<()> {
    for write in writes(spec, Utc::now()) {
        let action = format!(
            "{} writes Node {} ({:?})",
            write.manager, spec.name, write.target
        );
        let manager = Some(write.manager.to_string());
        let patch_params = PatchParams {
            field_manager: manager.clone(),
            ..PatchParams::default()
        };
        match write.target {
            Target::Create => {
                let node: Node = serde_json::from_value(write.body).map_err(json_err(&action))?;
                let params = PostParams {
                    field_manager: manager,
                    ..PostParams::default()
                };
                api.create(&params, &node).await.map_err(kube_err(action))?;
            }
            Target::Node => {
                api.patch(&spec.name, &patch_params, &Patch::Merge(write.body))
                    .await
                    .map_err(kube_err(action))?;
            }
            Target::Status => {
                api.patch_status(&spec.name, &patch_params, &Patch::Strategic(write.body))
                    .await
                    .map_err(kube_err(action))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Content, determinism and size of kubelet-sized nodes, without an apiserver.

    use super::*;
    use crate::shoot::NOT_MANAGED_BY_MCM_ANNOTATION;

    fn at() -> DateTime<Utc> {
        DateTime::from_timestamp(1_767_225_600, 0).unwrap_or_default()
    }

    fn condition_triples(node: &Value) -> Vec<(String, String, String)> {
        node["status"]["conditions"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|c| {
                        let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
                        (s("type"), s("status"), s("reason"))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn the_same_name_makes_the_same_node_and_another_name_another() {
        let spec = NodeSpec::new("node-7", "worker-a").kubelet_sized();
        let a = spec.node_json(at());
        assert_eq!(a, spec.clone().node_json(at()));
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            serde_json::to_string(&spec.node_json(at())).unwrap()
        );
        let other = NodeSpec::new("node-8", "worker-a")
            .kubelet_sized()
            .node_json(at());
        assert_ne!(a["status"]["images"], other["status"]["images"]);
        assert_ne!(
            a["status"]["nodeInfo"]["machineID"],
            other["status"]["nodeInfo"]["machineID"]
        );
        let id = a["status"]["nodeInfo"]["machineID"].as_str().unwrap();
        assert_eq!(id.len(), 32);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
    }

    #[test]
    fn the_seed_is_the_same_in_every_run() {
        // FNV-1a and SplitMix64 computed by hand: no std hasher (randomly keyed, or free to
        // change between Rust versions) and no crate's RNG (free to change between versions).
        let mut rng = Seeded::new("node-0");
        assert_eq!(rng.0, 0xe696_ebc2_2078_7810);
        assert_eq!(rng.next(), 0x44ef_1bf9_9b48_a394);
    }

    #[test]
    fn unmanaged_json_is_kilobytes_with_40_to_50_images() {
        let mut sizes = Vec::new();
        for i in 0..200 {
            let node = NodeSpec::new(format!("node-{i}"), "worker-a")
                .kubelet_sized()
                .node_json(at());
            let images = node["status"]["images"].as_array().unwrap();
            assert!((40..=50).contains(&images.len()), "{}", images.len());
            for image in images {
                let names = image["names"].as_array().unwrap();
                assert!((1..=3).contains(&names.len()), "{image}");
                assert!(names[0].as_str().unwrap().contains("@sha256:"));
            }
            let sizes_desc: Vec<u64> = images
                .iter()
                .map(|i| i["sizeBytes"].as_u64().unwrap())
                .collect();
            assert!(sizes_desc.windows(2).all(|w| w[0] >= w[1]), "largest first");
            sizes.push(serde_json::to_string(&node).unwrap().len());
        }
        let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
        // Without the managedFields the apiserver adds: 13–16 KiB measured, 9–20 KiB allowed.
        assert!(*min >= 9 * 1024 && *max <= 20 * 1024, "min {min} max {max}");
    }

    #[test]
    fn the_spec_decides_what_the_watchdog_reads() {
        let spec = NodeSpec::new("n-1", "pool-x")
            .in_zone("eu-west-1b")
            .with_label("tenant/team", "blue")
            .with_annotation(NOT_MANAGED_BY_MCM_ANNOTATION, "1")
            .with_condition("KernelDeadlock", "True", "Test")
            .with_condition("InPlaceUpdate", "True", "ReadyForUpdate")
            .kubelet_sized();
        let node = spec.node_json(at());
        let labels = &node["metadata"]["labels"];
        assert_eq!(labels[POOL_LABEL], "pool-x");
        assert_eq!(labels[ZONE_LABEL], "eu-west-1b");
        assert_eq!(labels[HOSTNAME_LABEL], "n-1");
        assert_eq!(labels["tenant/team"], "blue");
        assert_eq!(
            node["metadata"]["annotations"][NOT_MANAGED_BY_MCM_ANNOTATION],
            "1"
        );
        let conditions = condition_triples(&node);
        for c in &spec.conditions {
            assert_eq!(conditions.iter().filter(|x| x.0 == c.0).count(), 1, "{c:?}");
            assert!(conditions.contains(c), "{c:?} in {conditions:?}");
        }
        // Every condition not from the spec is healthy.
        for c in conditions.iter().filter(|c| !spec.conditions.contains(c)) {
            assert_eq!(c.1, "False", "{c:?}");
        }
        for t in dwd_core::shoot::DEFAULT_UNHEALTHY_CONDITIONS {
            assert!(conditions.iter().any(|c| c.0 == t), "{t} reported");
        }

        // No zone in the spec: none made up.
        let plain = NodeSpec::new("n-2", "pool-x")
            .kubelet_sized()
            .node_json(at());
        let labels = plain["metadata"]["labels"].as_object().unwrap();
        assert!(!labels.keys().any(|k| k.ends_with("/zone")), "{labels:?}");
        assert!(
            plain["metadata"]["annotations"]
                .get(NOT_MANAGED_BY_MCM_ANNOTATION)
                .is_none()
        );
        assert_eq!(
            condition_triples(&plain)
                .into_iter()
                .filter(|c| c.1 != "False")
                .collect::<Vec<_>>(),
            vec![("Ready".into(), "True".into(), "KubeletReady".into())]
        );
    }

    #[test]
    fn every_write_is_a_valid_node_and_the_create_keeps_the_spec() {
        let spec = NodeSpec::new("n-3", "p").with_condition("DiskPressure", "True", "Test");
        let spec = spec.kubelet_sized();
        let ws = writes(&spec, at());
        assert_eq!(ws[0].target, Target::Create);
        assert_eq!(ws[0].manager, KUBELET_MANAGER);
        // The create alone carries the spec's conditions and labels.
        let created = condition_triples(&ws[0].body);
        assert_eq!(created.len(), spec.conditions.len());
        for c in &spec.conditions {
            assert!(created.contains(c), "{c:?}");
        }
        let managers: std::collections::BTreeSet<&str> = ws.iter().map(|w| w.manager).collect();
        assert!(managers.len() >= 6, "{managers:?}");
        // What the client sends is what k8s-openapi's Node holds: nothing dropped on the way.
        let full = spec.node_json(at());
        let node: Node = serde_json::from_value(full.clone()).unwrap();
        assert_eq!(serde_json::to_value(&node).unwrap(), full);
        let created: Node = serde_json::from_value(ws[0].body.clone()).unwrap();
        assert_eq!(serde_json::to_value(&created).unwrap(), ws[0].body);
    }
}
