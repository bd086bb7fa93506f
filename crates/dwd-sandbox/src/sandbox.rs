//! Bringing the sandbox up and down, and the things a user (or the story) can break and heal.
//!
//! Up: etcd and four kube-apiservers (seed, alpha, beta, gamma) from the test environment;
//! the simulated shoots `alpha` (5 nodes), `beta` (3 nodes) and `gamma` (3 zones of 2 nodes,
//! labelled `topology.kubernetes.io/zone`) with kubelets renewing every
//! second, controllers at KCM 2 / MCM 1 / CA 1, two kube-apiserver pods and a kube-scheduler
//! pod labelled as Gardener labels them, and the `etcd-main-client` and `kube-apiserver`
//! EndpointSlices; the real prober and weeder as subprocesses with Gardener's configs; the
//! monitor. The timeline's clock starts when the watchdog does. Down: the reverse, leaving no
//! process behind.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use dwd_sim::{AbortOnDrop, EndpointsState, NodeSpec, SeedControlPlane, SimShoot, SimShootOptions};
use dwd_testenv::{ApiServer, ApiServerOptions, TestEnv};

use crate::config::{
    ETCD_SERVICE, KUBE_APISERVER_LABELS, KUBE_APISERVER_SERVICE, KUBE_SCHEDULER_LABELS,
    SandboxConfig,
};
use crate::journal::{Journal, lock};
use crate::monitor::{self, ETCD_ENDPOINTS, KUBE_APISERVER_ENDPOINTS, SharedView, ShootView, View};
use crate::watchdog::Watchdog;

/// One simulated shoot to create.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShootSpec {
    /// Short name.
    pub name: &'static str,
    /// Nodes without a zone label (when `zones` is empty).
    pub nodes: usize,
    /// Zones, each with `per_zone` nodes labelled `topology.kubernetes.io/zone`.
    pub zones: &'static [&'static str],
    /// Nodes per zone.
    pub per_zone: usize,
}

impl ShootSpec {
    /// Node count.
    pub(crate) fn node_count(&self) -> usize {
        if self.zones.is_empty() {
            self.nodes
        } else {
            self.zones.len() * self.per_zone
        }
    }
}

/// The simulated shoots: `alpha` and `beta` without zones, `gamma` in three zones.
pub(crate) const SHOOTS: [ShootSpec; 3] = [
    ShootSpec {
        name: "alpha",
        nodes: 5,
        zones: &[],
        per_zone: 0,
    },
    ShootSpec {
        name: "beta",
        nodes: 3,
        zones: &[],
        per_zone: 0,
    },
    ShootSpec {
        name: "gamma",
        nodes: 0,
        zones: &["eu-1a", "eu-1b", "eu-1c"],
        per_zone: 2,
    },
];
/// Kubelet lease renew interval of the simulated nodes.
pub(crate) const RENEW_INTERVAL: Duration = Duration::from_secs(1);
/// How long simulated pods take to start or stop after a Deployment is scaled: long enough
/// that the levels of a flow are visible one after another on the chart.
pub(crate) const POD_START_DELAY: Duration = Duration::from_secs(1);
/// kube-apiserver pods per shoot.
pub(crate) const KUBE_APISERVER_PODS: usize = 2;
/// kube-scheduler pods per shoot.
pub(crate) const KUBE_SCHEDULER_PODS: usize = 1;

/// The pods [`Sandbox::crashloop`] put into CrashLoopBackOff.
#[derive(Debug, Clone)]
pub(crate) struct Crashlooped {
    /// kube-apiserver pods (they need etcd).
    pub apiservers: Vec<String>,
    /// Pods that need the kube-apiserver (the kube-scheduler).
    pub dependants: Vec<String>,
}

/// The shoot namespace of a short shoot name.
pub(crate) fn namespace_of(shoot: &str) -> String {
    format!("shoot--sandbox--{shoot}")
}

/// One simulated shoot.
pub(crate) struct Shoot {
    /// Short name.
    pub name: String,
    /// Shoot namespace in the seed.
    pub namespace: String,
    /// Nodes.
    pub nodes: usize,
    /// Zone → its nodes (empty: no zone labels).
    pub zones: BTreeMap<String, Vec<String>>,
    /// Its kube-apiserver.
    pub api: ApiServer,
    /// The simulated data plane and control-plane objects.
    pub sim: SimShoot,
    /// Admin kubeconfig (copy in the sandbox directory).
    pub kubeconfig: PathBuf,
}

/// Where the sandbox keeps its files.
pub(crate) struct Workdir {
    /// The directory.
    pub path: PathBuf,
    /// Removes the directory on drop unless kept.
    temp: Option<tempfile::TempDir>,
}

impl Workdir {
    /// A fresh temporary directory.
    pub(crate) fn new() -> Result<Workdir> {
        let temp = tempfile::Builder::new()
            .prefix("dwd-sandbox-")
            .tempdir()
            .context("create the sandbox directory")?;
        Ok(Workdir {
            path: temp.path().to_path_buf(),
            temp: Some(temp),
        })
    }

    /// Keeps the directory after exit.
    pub(crate) fn keep(&mut self) {
        if let Some(temp) = self.temp.take() {
            let _ = temp.keep();
        }
    }

    /// Whether the directory will be kept.
    pub(crate) fn is_kept(&self) -> bool {
        self.temp.is_none()
    }
}

/// The running sandbox.
pub(crate) struct Sandbox {
    /// The journal (timeline and samples).
    pub journal: Arc<Journal>,
    /// The configs the watchdog runs.
    pub config: Arc<SandboxConfig>,
    /// What the monitor sees.
    pub view: SharedView,
    /// The simulated shoots.
    pub shoots: Vec<Shoot>,
    /// The prober subprocess.
    pub prober: Watchdog,
    /// The weeder subprocess.
    pub weeder: Watchdog,
    /// Seed admin kubeconfig (copy in the sandbox directory).
    pub seed_kubeconfig: PathBuf,
    /// The prober's configuration file.
    pub prober_config: PathBuf,
    /// The weeder's configuration file.
    pub weeder_config: PathBuf,
    /// The `dependency-watchdog` binary both run (and `explain --record` replays with).
    pub bin: PathBuf,
    monitor: Vec<AbortOnDrop>,
    env: TestEnv,
}

fn write(path: &Path, content: &str) -> Result<()> {
    std::fs::write(path, content).with_context(|| format!("write {}", path.display()))
}

impl Sandbox {
    /// Brings everything up with the watchdog binary `bin`, narrating as it goes.
    pub(crate) async fn start(
        journal: Arc<Journal>,
        dir: &Path,
        bin: &Path,
        config: Arc<SandboxConfig>,
    ) -> Result<Sandbox> {
        let (env, [seed, alpha, beta, gamma]) = start_control_plane(&journal).await?;

        let seed_client = seed.client().await.context("seed client")?;
        let seed_kubeconfig = dir.join("seed.kubeconfig");
        write(&seed_kubeconfig, seed.kubeconfig())?;

        let mut views = Vec::new();
        let mut shoots = Vec::new();
        for (spec, api) in SHOOTS.into_iter().zip([alpha, beta, gamma]) {
            let (name, nodes) = (spec.name, spec.node_count());
            let shoot = create_shoot(&seed_client, spec, api, dir).await?;
            let mut view =
                ShootView::new(name, &shoot.namespace, nodes, &config).with_zones(&shoot.zones);
            view.next_pod
                .insert("apiserver".into(), KUBE_APISERVER_PODS);
            view.next_pod
                .insert("scheduler".into(), KUBE_SCHEDULER_PODS);
            views.push(view);
            narrate_shoot(&journal, &shoot);
            journal.sample_silenced(name, 0);
            journal.sample_etcd(name, true);
            shoots.push(shoot);
        }

        let prober_config = dir.join("prober-config.yaml");
        let weeder_config = dir.join("weeder-config.yaml");
        write(&prober_config, &config.prober.yaml)?;
        write(&weeder_config, &config.weeder.yaml)?;

        // The story starts here: everything the watchdog will see is in place, and what
        // happens from now on is the watchdog's doing (or the story's).
        let setup = journal.start_clock();
        journal.say(&format!(
            "\nsetup took {:.1}s; the clock starts now: t = 0 is when the watchdog starts",
            setup.as_secs_f64()
        ));
        let prober = Watchdog::spawn(bin, "prober", &prober_config, &seed_kubeconfig, dir)?;
        let weeder = Watchdog::spawn(bin, "weeder", &weeder_config, &seed_kubeconfig, dir)?;
        let view: SharedView = Arc::new(std::sync::Mutex::new(View {
            shoots: views,
            ..Default::default()
        }));
        let mut shoot_clients = Vec::new();
        for s in &shoots {
            shoot_clients.push((s.name.clone(), s.api.client().await?));
        }
        let monitor = monitor::start(
            journal.clone(),
            config.clone(),
            view.clone(),
            seed_client.clone(),
            shoot_clients,
            prober.metrics,
            weeder.metrics,
        );
        let sandbox = Sandbox {
            journal: journal.clone(),
            config,
            view,
            shoots,
            prober,
            weeder,
            seed_kubeconfig,
            prober_config,
            weeder_config,
            bin: bin.to_path_buf(),
            monitor,
            env,
        };
        for w in [&sandbox.prober, &sandbox.weeder] {
            narrate_running(&journal, w).await?;
        }
        Ok(sandbox)
    }

    /// The shoot with this short name.
    pub(crate) fn shoot(&self, name: &str) -> Result<&Shoot> {
        self.shoots
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| anyhow!("no shoot {name:?}; shoots: {}", self.shoot_names()))
    }

    /// The shoots' short names, `alpha, beta, gamma`.
    pub(crate) fn shoot_names(&self) -> String {
        self.shoots
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// A copy of the monitor's view.
    pub(crate) fn view(&self) -> View {
        lock(&self.view).clone()
    }

    /// Whether both watchdog processes still run; the error names the one that does not.
    pub(crate) fn check_watchdogs(&self) -> Result<()> {
        for w in [&self.prober, &self.weeder] {
            w.check_running("")?;
        }
        Ok(())
    }

    fn set_view<F: FnOnce(&mut ShootView)>(&self, shoot: &str, f: F) {
        if let Some(s) = lock(&self.view).shoot_mut(shoot) {
            f(s);
        }
    }

    /// Silences the first `n` kubelets of a shoot (and resumes the others).
    pub(crate) fn silence(&self, shoot: &str, n: usize, why: &str) -> Result<()> {
        let s = self.shoot(shoot)?;
        let n = n.min(s.nodes);
        let kubelets = s.sim.kubelets();
        kubelets.resume_all();
        let names = kubelets.silence_count(n);
        self.set_view(shoot, |v| v.silenced = n);
        self.journal.sample_silenced(shoot, n);
        let what = if n == 0 {
            format!("all {} kubelets renew their leases", s.nodes)
        } else {
            format!("{n} of {} kubelets silenced: {}", s.nodes, names.join(", "))
        };
        self.journal.log(shoot, what, Some(why.to_string()));
        Ok(())
    }

    /// The nodes of a shoot's zone.
    fn zone_nodes<'a>(&self, s: &'a Shoot, zone: &str) -> Result<&'a [String]> {
        s.zones.get(zone).map(Vec::as_slice).ok_or_else(|| {
            if s.zones.is_empty() {
                anyhow!(
                    "shoot {} has no zones (its nodes carry no zone label)",
                    s.name
                )
            } else {
                anyhow!(
                    "shoot {} has no zone {zone:?}; zones: {}",
                    s.name,
                    s.zones.keys().cloned().collect::<Vec<_>>().join(", ")
                )
            }
        })
    }

    /// Silences every kubelet of one zone of a shoot (a zone's NAT gateway fails); the other
    /// zones' kubelets keep their state.
    pub(crate) fn silence_zone(&self, shoot: &str, zone: &str, why: &str) -> Result<()> {
        self.switch_zone(shoot, zone, true, why)
    }

    /// Lets the kubelets of one zone of a shoot renew again.
    pub(crate) fn heal_zone(&self, shoot: &str, zone: &str, why: &str) -> Result<()> {
        self.switch_zone(shoot, zone, false, why)
    }

    /// Silences (`silence`) or resumes the kubelets of one zone of a shoot, leaving the other
    /// zones' kubelets as they are; updates the view and the record and logs it.
    fn switch_zone(&self, shoot: &str, zone: &str, silence: bool, why: &str) -> Result<()> {
        let s = self.shoot(shoot)?;
        let nodes = self.zone_nodes(s, zone)?;
        let kubelets = s.sim.kubelets();
        let names: Vec<&str> = nodes.iter().map(String::as_str).collect();
        let what = if silence {
            kubelets.silence(&names);
            format!(
                "zone {zone}: all {} kubelets silenced: {}",
                nodes.len(),
                nodes.join(", ")
            )
        } else {
            kubelets.resume(&names);
            format!(
                "zone {zone}: its {} kubelets renew their leases again",
                nodes.len()
            )
        };
        let n = kubelets.silenced().len();
        self.set_view(shoot, |v| v.silenced = n);
        self.journal.sample_silenced(shoot, n);
        self.journal.log(shoot, what, Some(why.to_string()));
        Ok(())
    }

    /// Lets every kubelet of a shoot renew again.
    pub(crate) fn heal(&self, shoot: &str, why: &str) -> Result<()> {
        let s = self.shoot(shoot)?;
        s.sim.kubelets().resume_all();
        self.set_view(shoot, |v| v.silenced = 0);
        self.journal.sample_silenced(shoot, 0);
        self.journal.log(
            shoot,
            format!("all {} kubelets renew their leases again", s.nodes),
            Some(why.to_string()),
        );
        Ok(())
    }

    /// Stops a shoot's kube-apiserver (connections refused).
    pub(crate) async fn stop_apiserver(&self, shoot: &str) -> Result<()> {
        let s = self.shoot(shoot)?;
        // Told first: the front door closes at once, the process takes a moment to exit.
        self.journal.log(
            shoot,
            "shoot kube-apiserver stopped",
            Some("kubelets and the prober's API server probe get connection refused".into()),
        );
        s.api.stop().await.context("stop the kube-apiserver")?;
        self.set_view(shoot, |v| v.apiserver_up = false);
        Ok(())
    }

    /// Starts a stopped shoot kube-apiserver again.
    pub(crate) async fn start_apiserver(&self, shoot: &str) -> Result<()> {
        let s = self.shoot(shoot)?;
        s.api.start().await.context("start the kube-apiserver")?;
        self.set_view(shoot, |v| v.apiserver_up = true);
        self.journal
            .log(shoot, "shoot kube-apiserver running again", None);
        Ok(())
    }

    /// Puts the shoot's `pods` into CrashLoopBackOff and says so, and `why`, on the timeline
    /// (nothing when there are none).
    async fn crashloop_pods(&self, s: &Shoot, pods: &[String], why: &str) -> Result<()> {
        for pod in pods {
            s.sim
                .seed()
                .set_crashlooping(pod, true)
                .await
                .with_context(|| format!("crash-loop pod {pod}"))?;
        }
        if !pods.is_empty() {
            self.journal.log(
                &s.name,
                format!("{} in CrashLoopBackOff", pods.join(", ")),
                Some(why.to_string()),
            );
        }
        Ok(())
    }

    /// Puts every kube-apiserver pod of a shoot into CrashLoopBackOff, and with them what
    /// needs them: the kube-apiserver service loses its ready endpoints and the kube-scheduler
    /// crash-loops too (as in a seed whose etcd is gone).
    pub(crate) async fn crashloop(&self, shoot: &str, why: &str) -> Result<Crashlooped> {
        let s = self.shoot(shoot)?;
        let pods_of = |role: &str| -> Vec<String> {
            self.view()
                .shoot(shoot)
                .map(|v| {
                    v.pods
                        .iter()
                        .filter(|(_, p)| p.role == role && !p.deleted)
                        .map(|(n, _)| n.clone())
                        .collect()
                })
                .unwrap_or_default()
        };
        let apiservers = pods_of("apiserver");
        let dependants = pods_of("scheduler");
        if apiservers.is_empty() {
            bail!("{shoot} has no kube-apiserver pod to crash-loop");
        }
        self.crashloop_pods(s, &apiservers, why).await?;
        s.sim
            .seed()
            .set_endpoint_slice(
                KUBE_APISERVER_SERVICE,
                KUBE_APISERVER_ENDPOINTS,
                EndpointsState::NotReady,
            )
            .await
            .context("make the kube-apiserver EndpointSlice not ready")?;
        self.set_view(shoot, |v| v.kube_apiserver_ready = false);
        self.journal.log(
            shoot,
            format!("{KUBE_APISERVER_SERVICE}: no ready endpoint"),
            Some("its pods crash-loop".into()),
        );
        let why = "the kube-scheduler cannot reach the kube-apiserver";
        self.crashloop_pods(s, &dependants, why).await?;
        Ok(Crashlooped {
            apiservers,
            dependants,
        })
    }

    /// Makes etcd-main-client of a shoot not ready (etcd down).
    pub(crate) async fn etcd_down(&self, shoot: &str, why: &str) -> Result<()> {
        self.switch_etcd(shoot, false, why).await
    }

    /// Makes etcd-main-client of a shoot ready again (etcd back).
    pub(crate) async fn etcd_up(&self, shoot: &str, why: &str) -> Result<()> {
        self.switch_etcd(shoot, true, why).await
    }

    /// Sets all endpoints of the shoot's etcd-main-client ready or not ready, and tells the
    /// view, the report's samples and the timeline.
    async fn switch_etcd(&self, shoot: &str, ready: bool, why: &str) -> Result<()> {
        let (state, what) = if ready {
            (
                EndpointsState::AllReady,
                format!("all {ETCD_ENDPOINTS} endpoints ready again"),
            )
        } else {
            (EndpointsState::NotReady, "no ready endpoint".to_string())
        };
        self.shoot(shoot)?
            .sim
            .seed()
            .set_endpoint_slice(ETCD_SERVICE, ETCD_ENDPOINTS, state)
            .await
            .with_context(|| format!("set {ETCD_SERVICE} to {state:?}"))?;
        let now = self.journal.now();
        self.set_view(shoot, |v| {
            v.etcd_ready = ready;
            if ready {
                v.etcd_ready_since = Some(now);
            }
        });
        self.journal.sample_etcd(shoot, ready);
        self.journal.log(
            shoot,
            format!("{ETCD_SERVICE}: {what}"),
            Some(why.to_string()),
        );
        Ok(())
    }

    /// Pids of every process the sandbox runs.
    pub(crate) fn pids(&self) -> Vec<u32> {
        let mut pids = self.env.pids();
        pids.extend(self.prober.pid());
        pids.extend(self.weeder.pid());
        pids
    }

    /// Stops everything: watchdogs (SIGTERM, then SIGKILL), monitor, simulators, apiservers
    /// and etcd.
    pub(crate) async fn teardown(self) {
        let Sandbox {
            prober,
            weeder,
            monitor,
            shoots,
            env,
            ..
        } = self;
        // Stopping waits for the processes to exit: off the async threads.
        let stopped = tokio::task::spawn_blocking(move || {
            prober.stop();
            weeder.stop();
        })
        .await;
        if stopped.is_err() {
            eprintln!(
                "dwd-sandbox: stopping the watchdog processes failed; they are killed on exit"
            );
        }
        drop(monitor);
        drop(shoots);
        env.teardown();
    }
}

/// Starts etcd and the kube-apiservers (seed, then the shoots in [`SHOOTS`]' order) from
/// the real binaries, narrating; returns the environment and the four apiservers.
async fn start_control_plane(journal: &Journal) -> Result<(TestEnv, [ApiServer; 4])> {
    // Located (or, on a machine's first run, built) before the spinner starts: the build
    // reports its progress on stderr and a spinner would overwrite it.
    let binaries = tokio::task::spawn_blocking(dwd_testenv::binaries)
        .await
        .context("locate the control-plane binaries")?
        .context(
            "locate the control-plane binaries (built once per machine from pinned Go modules)",
        )?;
    journal.log(
        "-",
        "starting etcd and the kube-apiservers seed, alpha, beta and gamma",
        Some(format!(
            "the real binaries, on loopback: {}",
            binaries.kube_apiserver.display()
        )),
    );
    journal.waiting(
        "etcd and four kube-apiservers to be ready",
        Duration::from_secs(120),
    );
    let started = async {
        let env = TestEnv::start()
            .await
            .context("start the test environment")?;
        let servers = tokio::try_join!(
            env.start_apiserver_with("seed", ApiServerOptions::seed()),
            env.start_apiserver(SHOOTS[0].name),
            env.start_apiserver(SHOOTS[1].name),
            env.start_apiserver(SHOOTS[2].name),
        )
        .context("start the kube-apiservers")?;
        anyhow::Ok((env, servers))
    }
    .await;
    journal.done_waiting();
    let (env, (seed, alpha, beta, gamma)) = started?;
    journal.log(
        "-",
        "control plane ready",
        Some(format!(
            "etcd {}, seed {}, alpha {}, beta {}, gamma {}",
            env.etcd_url(),
            seed.url(),
            alpha.url(),
            beta.url(),
            gamma.url()
        )),
    );
    Ok((env, [seed, alpha, beta, gamma]))
}

/// Tells what a simulated shoot has: its nodes (and zones), controllers, pods and services.
fn narrate_shoot(journal: &Journal, shoot: &Shoot) {
    let nodes = shoot.nodes;
    journal.log(
        &shoot.name,
        format!(
            "simulated shoot {}: {nodes} nodes, controllers KCM 2 / MCM 1 / CA 1, {KUBE_APISERVER_PODS} kube-apiserver pods and a kube-scheduler, {ETCD_SERVICE} and {KUBE_APISERVER_SERVICE} ready",
            shoot.namespace
        ),
        Some(format!(
            "kubelets renew their node leases every {}s{}",
            RENEW_INTERVAL.as_secs(),
            if shoot.zones.is_empty() {
                String::new()
            } else {
                format!(
                    "; nodes in zones {} (label {})",
                    shoot
                        .zones
                        .iter()
                        .map(|(z, n)| format!("{z}: {}", n.join(", ")))
                        .collect::<Vec<_>>()
                        .join("; "),
                    dwd_sim::ZONE_LABEL
                )
            }
        )),
    );
}

/// Waits (up to 10 s) for a watchdog process to be ready and tells that it runs, with a
/// warning when it is alive but not ready.
async fn narrate_running(journal: &Journal, w: &Watchdog) -> Result<()> {
    if let Some(answer) = w.wait_ready(Duration::from_secs(10)).await? {
        journal.log(
            "-",
            format!(
                "warning: dependency-watchdog {} alive but not ready after 10s",
                w.component
            ),
            Some(format!(
                "/readyz answers {answer}; going on, the story checks what it does"
            )),
        );
    }
    journal.log(
        "-",
        format!(
            "dependency-watchdog {} running (pid {})",
            w.component,
            w.pid().map_or("?".into(), |p| p.to_string())
        ),
        Some(format!(
            "metrics http://{}/metrics, log {}",
            w.metrics,
            w.log.display()
        )),
    );
    Ok(())
}

/// Creates one simulated shoot with its weeder-relevant objects.
async fn create_shoot(
    seed_client: &kube::Client,
    spec: ShootSpec,
    api: ApiServer,
    dir: &Path,
) -> Result<Shoot> {
    let (name, nodes) = (spec.name, spec.node_count());
    let namespace = namespace_of(name);
    let mut options = SimShootOptions::new(&namespace)
        .with_nodes(nodes)
        .with_renew_interval(RENEW_INTERVAL);
    options.node_prefix = format!("{name}-node-");
    let mut zones: BTreeMap<String, Vec<String>> = BTreeMap::new();
    if !spec.zones.is_empty() {
        let mut specs = Vec::new();
        for zone in spec.zones {
            for i in 0..spec.per_zone {
                let node = format!("{name}-{zone}-{i}");
                zones
                    .entry(zone.to_string())
                    .or_default()
                    .push(node.clone());
                specs.push(NodeSpec::new(node, dwd_sim::shoot::DEFAULT_POOL).in_zone(zone));
            }
        }
        options.node_specs = Some(specs);
    }
    options.deployment_status_delay = Some(POD_START_DELAY);
    let shoot_client = api
        .client()
        .await
        .with_context(|| format!("{name} client"))?;
    let sim = SimShoot::create(seed_client.clone(), shoot_client, api.kubeconfig(), options)
        .await
        .with_context(|| format!("create simulated shoot {name}"))?;
    let cp: &SeedControlPlane = sim.seed();
    cp.set_endpoint_slice(ETCD_SERVICE, ETCD_ENDPOINTS, EndpointsState::AllReady)
        .await
        .with_context(|| format!("create {ETCD_SERVICE} of {name}"))?;
    cp.set_endpoint_slice(
        KUBE_APISERVER_SERVICE,
        KUBE_APISERVER_ENDPOINTS,
        EndpointsState::AllReady,
    )
    .await
    .with_context(|| format!("create the kube-apiserver EndpointSlice of {name}"))?;
    for i in 0..KUBE_APISERVER_PODS {
        cp.create_running_pod(&format!("kube-apiserver-{i}"), &KUBE_APISERVER_LABELS)
            .await
            .with_context(|| format!("create kube-apiserver pods of {name}"))?;
    }
    for i in 0..KUBE_SCHEDULER_PODS {
        cp.create_running_pod(&format!("kube-scheduler-{i}"), &KUBE_SCHEDULER_LABELS)
            .await
            .with_context(|| format!("create kube-scheduler pods of {name}"))?;
    }
    let kubeconfig = dir.join(format!("{name}.kubeconfig"));
    write(&kubeconfig, api.kubeconfig())?;
    Ok(Shoot {
        name: name.to_string(),
        namespace,
        nodes,
        zones,
        api,
        sim,
        kubeconfig,
    })
}
