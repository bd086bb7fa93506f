//! Test environment: real etcd and kube-apiservers on loopback — our envtest.
//!
//! One [`TestEnv`] owns a temporary directory, a certificate authority, one etcd and any
//! number of kube-apiservers ([`ApiServer`]) that share that etcd through distinct
//! `--etcd-prefix`es: one seed plus N shoots, each with its own API; an apiserver may instead
//! have an etcd of its own ([`ApiServerOptions::own_etcd`], as a real shoot does). The binaries
//! are the real ones, built once per machine from pinned Go modules (see `testenv/build.sh`).
//!
//! Every apiserver sits behind a [`front_door`] so tests can stop it (connections refused),
//! start it again on the same address, make it answer `429 Too Many Requests`, or make it
//! slow. Everything is torn down on drop, on panic, at process exit (for the shared
//! environment), and by the kernel if the test process is killed.

pub mod binaries;
pub mod cargo;
pub mod front_door;
pub mod http;
pub mod metrics;
pub mod pki;
pub mod process;
pub mod reference;
pub mod service_account;

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use base64::Engine as _;
use kube::api::{Api, PostParams};
use tokio::runtime::{Handle, Runtime};

use crate::binaries::Binaries;
use crate::front_door::{FrontDoor, FrontDoorState};
use crate::pki::{CertAndKey, Pki};
use crate::process::ManagedProcess;

pub use binaries::binaries;

/// CRD of `clusters.extensions.gardener.cloud` (cluster-scoped; spec.shoot/seed/cloudProfile raw).
pub const CLUSTER_CRD_YAML: &str = include_str!("../crds/clusters.extensions.gardener.cloud.yaml");
/// CRD of `machines.machine.sapcloud.io` (namespaced, status subresource).
pub const MACHINE_CRD_YAML: &str = include_str!("../crds/machines.machine.sapcloud.io.yaml");

/// How long an apiserver or etcd may take to become ready before start fails.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// Errors of the test environment; each names what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum TestEnvError {
    /// The control-plane binaries could not be found or built.
    #[error("control-plane binaries: {0}")]
    Binaries(String),
    /// A filesystem or socket operation failed.
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    /// Certificate generation failed.
    #[error("certificates: {0}")]
    Pki(String),
    /// A process or task could not be started.
    #[error("starting {0}: {1}")]
    Spawn(String, String),
    /// A component did not become ready in time.
    #[error("{what} not ready within {timeout:?}: {detail}")]
    NotReady {
        /// What was started.
        what: String,
        /// How long we waited.
        timeout: Duration,
        /// Last error and log tail.
        detail: String,
    },
    /// A kube client could not be built or a request failed.
    #[error("kube client for {0}: {1}")]
    Client(String, String),
}

/// Options for one apiserver.
#[derive(Debug, Clone, Default)]
pub struct ApiServerOptions {
    /// Install the Cluster and Machine CRDs (what a seed needs).
    pub install_crds: bool,
    /// Write an audit log (JSON lines, `Metadata` level) to this apiserver's directory.
    pub audit_log: bool,
    /// Extra kube-apiserver flags, appended last (they override ours).
    pub extra_args: Vec<String>,
    /// An etcd of its own, as every real shoot has (its `etcd-main`), instead of the
    /// environment's shared one. With one etcd for many apiservers its revision moves with all
    /// their writes, and a consistent list served from the watch cache waits until the cache
    /// has seen that revision (etcd's progress notifications, since the other apiservers'
    /// writes are no events of its watch): in the bench's mass outage (10 shoot apiservers, 50,000
    /// leases renewed every 120 s on one etcd) that wait averaged 0.23 s a list
    /// (`apiserver_watch_cache_read_wait_seconds`).
    pub own_etcd: bool,
}

impl ApiServerOptions {
    /// A seed apiserver: CRDs installed.
    pub fn seed() -> Self {
        ApiServerOptions {
            install_crds: true,
            ..Default::default()
        }
    }
}

struct EnvInner {
    id: String,
    dir: PathBuf,
    keep_dir: bool,
    runtime: Mutex<Option<Runtime>>,
    handle: Handle,
    pki: Arc<Pki>,
    tls: Arc<rustls::ServerConfig>,
    admin: CertAndKey,
    binaries: Binaries,
    etcd: Mutex<Option<ManagedProcess>>,
    etcd_url: String,
    apiservers: Mutex<Vec<Arc<ApiServerInner>>>,
    torn_down: AtomicBool,
}

/// A running test environment; dropping it stops every process and removes its directory.
pub struct TestEnv {
    inner: Arc<EnvInner>,
}

/// Locks a mutex, recovering the data if a panicking test poisoned it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn live_envs() -> &'static Mutex<Vec<Weak<EnvInner>>> {
    static LIVE: Mutex<Vec<Weak<EnvInner>>> = Mutex::new(Vec::new());
    &LIVE
}

extern "C" fn teardown_all_at_exit() {
    let envs: Vec<_> = lock(live_envs()).iter().filter_map(Weak::upgrade).collect();
    for env in envs {
        env.teardown();
    }
}

// `atexit` has no safe wrapper in std or rustix.
#[allow(unsafe_code)]
fn register_exit_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registering a plain extern "C" fn without arguments.
        unsafe {
            libc::atexit(teardown_all_at_exit);
        }
    });
}

/// Root of all environment directories; each is named `<pid>-<n>` so stale ones can be swept.
fn envs_root() -> PathBuf {
    std::env::temp_dir().join("dwd-testenv")
}

/// Removes directories left by test processes that no longer exist (e.g. killed by SIGKILL).
fn sweep_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(envs_root()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = name.split('-').next().and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && pid != std::process::id()
            && !process::pid_alive(pid)
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Picks a free loopback port, never the same one twice in this process.
pub fn free_port() -> Result<u16, TestEnvError> {
    static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    for _ in 0..100 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| TestEnvError::Io("bind a free port".into(), e))?;
        let port = listener
            .local_addr()
            .map_err(|e| TestEnvError::Io("read a free port".into(), e))?
            .port();
        if lock(&HANDED_OUT)
            .get_or_insert_with(HashSet::new)
            .insert(port)
        {
            return Ok(port);
        }
    }
    Err(TestEnvError::Spawn(
        "port allocation".into(),
        "no fresh port after 100 tries".into(),
    ))
}

impl TestEnv {
    /// Starts a new environment: certificates and etcd (apiservers come with
    /// [`TestEnv::start_apiserver`]). Builds the binaries on first use.
    pub async fn start() -> Result<TestEnv, TestEnvError> {
        // Build/locate binaries and start etcd on a plain thread: both block.
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let _ = tx.send(Self::start_blocking());
        });
        rx.await.map_err(|_| {
            TestEnvError::Spawn("test environment".into(), "start thread panicked".into())
        })?
    }

    fn start_blocking() -> Result<TestEnv, TestEnvError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        register_exit_hook();
        sweep_stale_dirs();
        let binaries = binaries::binaries()?;
        let id = format!(
            "{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::SeqCst)
        );
        let dir = envs_root().join(&id);
        std::fs::create_dir_all(&dir)
            .map_err(|e| TestEnvError::Io(format!("create {}", dir.display()), e))?;
        let keep_dir = std::env::var_os("DWD_TESTENV_KEEP").is_some();

        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("dwd-testenv")
            .enable_all()
            .build()
            .map_err(|e| TestEnvError::Io("test environment runtime".into(), e))?;
        let handle = runtime.handle().clone();

        let pki = Pki::generate()?;
        let admin = pki.issue_client("admin", &["system:masters"])?;
        let tls = front_door::tls_config(&pki.serving)?;
        write_file(&dir.join("ca.crt"), &pki.ca_pem())?;
        write_file(&dir.join("serving.crt"), &pki.serving.cert_pem)?;
        write_file(&dir.join("serving.key"), &pki.serving.key_pem)?;
        write_file(&dir.join("sa.key"), &pki.service_account_key_pem)?;
        write_file(&dir.join("sa.pub"), &pki.service_account_pub_pem)?;

        let (etcd, etcd_url) =
            start_etcd(&binaries.etcd, &dir.join("etcd"), &dir.join("etcd.log"))?;

        let inner = Arc::new(EnvInner {
            id,
            dir,
            keep_dir,
            runtime: Mutex::new(Some(runtime)),
            handle,
            pki: Arc::new(pki),
            tls,
            admin,
            binaries,
            etcd: Mutex::new(Some(etcd)),
            etcd_url,
            apiservers: Mutex::new(Vec::new()),
            torn_down: AtomicBool::new(false),
        });
        lock(live_envs()).push(Arc::downgrade(&inner));
        Ok(TestEnv { inner })
    }

    /// The environment shared by all tests of one test binary (started on first use,
    /// torn down at process exit), with a seed apiserver named `seed` that has the CRDs.
    pub async fn shared() -> Result<&'static TestEnv, TestEnvError> {
        static SHARED: tokio::sync::OnceCell<TestEnv> = tokio::sync::OnceCell::const_new();
        SHARED
            .get_or_try_init(|| async {
                let env = TestEnv::start().await?;
                env.start_apiserver_with("seed", ApiServerOptions::seed())
                    .await?;
                Ok(env)
            })
            .await
    }

    /// Starts a kube-apiserver named `name` (also its etcd prefix) with default options.
    pub async fn start_apiserver(&self, name: &str) -> Result<ApiServer, TestEnvError> {
        self.start_apiserver_with(name, ApiServerOptions::default())
            .await
    }

    /// Starts a kube-apiserver named `name` and waits until it is ready.
    pub async fn start_apiserver_with(
        &self,
        name: &str,
        options: ApiServerOptions,
    ) -> Result<ApiServer, TestEnvError> {
        let env = self.inner.clone();
        let name = name.to_string();
        let handle = self.inner.handle.clone();
        handle
            .spawn(async move { ApiServer::launch(env, name, options).await })
            .await
            .map_err(|e| TestEnvError::Spawn("apiserver".into(), e.to_string()))?
    }

    /// The apiserver with this name, if started.
    pub fn apiserver(&self, name: &str) -> Option<ApiServer> {
        lock(&self.inner.apiservers)
            .iter()
            .find(|a| a.name == name)
            .map(|inner| ApiServer {
                inner: inner.clone(),
            })
    }

    /// This environment's directory (certificates, logs, etcd data).
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The etcd client URL.
    pub fn etcd_url(&self) -> &str {
        &self.inner.etcd_url
    }

    /// Pids of every process this environment runs now.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = lock(&self.inner.etcd)
            .iter()
            .filter_map(ManagedProcess::pid)
            .collect();
        for a in lock(&self.inner.apiservers).iter() {
            pids.extend(lock(&a.process).as_ref().and_then(ManagedProcess::pid));
        }
        pids
    }

    /// A short human description of what runs, for the README's first command.
    pub fn describe(&self) -> String {
        let mut out = format!(
            "test environment {} in {}\n  etcd           {}  pid {:?}\n",
            self.inner.id,
            self.inner.dir.display(),
            self.inner.etcd_url,
            lock(&self.inner.etcd)
                .as_ref()
                .and_then(ManagedProcess::pid)
        );
        for a in lock(&self.inner.apiservers).iter() {
            out.push_str(&format!(
                "  kube-apiserver {:<14} https://{}  (backend :{}, etcd prefix /{}, pid {:?})\n      kubeconfig {}\n",
                a.name,
                a.front_addr,
                a.backend_addr.port(),
                a.name,
                lock(&a.process).as_ref().and_then(ManagedProcess::pid),
                a.dir.join("admin.kubeconfig").display()
            ));
        }
        out
    }

    /// Stops everything now (also done on drop).
    pub fn teardown(&self) {
        self.inner.teardown();
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        self.inner.teardown();
    }
}

impl EnvInner {
    fn teardown(&self) {
        if self.torn_down.swap(true, Ordering::SeqCst) {
            return;
        }
        for a in lock(&self.apiservers).drain(..) {
            lock(&a.front_door).take();
            if let Some(mut p) = lock(&a.process).take() {
                p.kill();
            }
            if let Some(mut etcd) = lock(&a.own_etcd).take() {
                etcd.kill();
            }
        }
        if let Some(mut etcd) = lock(&self.etcd).take() {
            etcd.kill();
        }
        if let Some(rt) = lock(&self.runtime).take() {
            rt.shutdown_background();
        }
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn write_file(path: &Path, content: &str) -> Result<(), TestEnvError> {
    std::fs::write(path, content)
        .map_err(|e| TestEnvError::Io(format!("write {}", path.display()), e))
}

/// Starts an etcd with its data in `data_dir`, logging to `log`, and waits until it is healthy
/// (blocking); returns it with its client URL.
fn start_etcd(
    binary: &Path,
    data_dir: &Path,
    log: &Path,
) -> Result<(ManagedProcess, String), TestEnvError> {
    let client_port = free_port()?;
    let peer_port = free_port()?;
    let etcd_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let etcd_args = vec![
        "--name=default".to_string(),
        format!("--data-dir={}", data_dir.display()),
        format!("--listen-client-urls={etcd_url}"),
        format!("--advertise-client-urls={etcd_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=default={peer_url}"),
        // Test data is disposable; fsync would dominate apiserver latency on this disk.
        "--unsafe-no-fsync=true".to_string(),
        "--log-level=warn".to_string(),
        "--quota-backend-bytes=8589934592".to_string(),
    ];
    let mut etcd = ManagedProcess::spawn("etcd", binary, &etcd_args, log)?;
    wait_etcd_healthy(client_port, &mut etcd)?;
    Ok((etcd, etcd_url))
}

fn wait_etcd_healthy(port: u16, etcd: &mut ManagedProcess) -> Result<(), TestEnvError> {
    use std::io::{Read, Write};
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut last = String::from("no answer yet");
    while Instant::now() < deadline {
        if etcd.has_exited() {
            return Err(TestEnvError::NotReady {
                what: "etcd".into(),
                timeout: READY_TIMEOUT,
                detail: format!("etcd exited:\n{}", etcd.log_tail(2000)),
            });
        }
        match std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)) {
            Ok(mut s) => {
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let _ = s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
                let mut body = String::new();
                let _ = s.read_to_string(&mut body);
                if body.contains("\"health\":\"true\"") {
                    return Ok(());
                }
                last = body;
            }
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(TestEnvError::NotReady {
        what: "etcd".into(),
        timeout: READY_TIMEOUT,
        detail: last,
    })
}

struct ApiServerInner {
    name: String,
    dir: PathBuf,
    args: Vec<String>,
    env: Weak<EnvInner>,
    binary: PathBuf,
    pki: Arc<Pki>,
    tls: Arc<rustls::ServerConfig>,
    handle: Handle,
    front_addr: SocketAddr,
    backend_addr: SocketAddr,
    kubeconfig: String,
    state: Arc<FrontDoorState>,
    process: Mutex<Option<ManagedProcess>>,
    front_door: Mutex<Option<FrontDoor>>,
    /// Its own etcd ([`ApiServerOptions::own_etcd`]); runs while the apiserver is stopped.
    own_etcd: Mutex<Option<ManagedProcess>>,
}

/// The kube-apiserver flags of [`ApiServerOptions::audit_log`]: every request at Metadata
/// level, written as JSON to `dir/audit.log` in batches at most a second apart; the policy
/// file is written to `dir`.
fn audit_log_args(dir: &Path) -> Result<[String; 5], TestEnvError> {
    let policy = dir.join("audit-policy.yaml");
    write_file(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n",
    )?;
    Ok([
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-log-path={}", dir.join("audit.log").display()),
        "--audit-log-format=json".into(),
        "--audit-log-mode=batch".into(),
        "--audit-log-batch-max-wait=1s".into(),
    ])
}

/// Handle to one kube-apiserver of a [`TestEnv`]; cheap to clone.
#[derive(Clone)]
pub struct ApiServer {
    inner: Arc<ApiServerInner>,
}

impl ApiServer {
    async fn launch(
        env: Arc<EnvInner>,
        name: String,
        options: ApiServerOptions,
    ) -> Result<ApiServer, TestEnvError> {
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(TestEnvError::Spawn(
                name,
                "apiserver names are [A-Za-z0-9-]+".into(),
            ));
        }
        let dir = env.dir.join(&name);
        std::fs::create_dir_all(&dir)
            .map_err(|e| TestEnvError::Io(format!("create {}", dir.display()), e))?;
        let backend_addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, free_port()?));
        let front_addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, free_port()?));
        let d = &env.dir;
        let (own_etcd, etcd_url) = if options.own_etcd {
            let (etcd, url) = Self::start_own_etcd(&env, &name, &dir).await?;
            (Some(etcd), url)
        } else {
            (None, env.etcd_url.clone())
        };
        let mut args = vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--etcd-prefix=/{name}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={}", backend_addr.port()),
            format!("--cert-dir={}", dir.join("certs").display()),
            format!("--tls-cert-file={}", d.join("serving.crt").display()),
            format!("--tls-private-key-file={}", d.join("serving.key").display()),
            format!("--client-ca-file={}", d.join("ca.crt").display()),
            "--authorization-mode=RBAC".into(),
            format!("--service-account-issuer=https://{name}.testenv.invalid"),
            format!("--service-account-key-file={}", d.join("sa.pub").display()),
            format!(
                "--service-account-signing-key-file={}",
                d.join("sa.key").display()
            ),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--allow-privileged=true".into(),
            // No kube-controller-manager runs, so no namespace ever gets a `default`
            // ServiceAccount; like envtest, don't require one for pods.
            "--disable-admission-plugins=ServiceAccount".into(),
            // Several apiservers, one per etcd prefix: none should reconcile endpoints.
            "--endpoint-reconciler-type=none".into(),
            "--profiling=false".into(),
        ];
        if options.audit_log {
            args.extend(audit_log_args(&dir)?);
        }
        args.extend(options.extra_args.iter().cloned());

        let kubeconfig = make_kubeconfig(&name, front_addr, &env.pki.ca_pem(), &env.admin);
        write_file(&dir.join("admin.kubeconfig"), &kubeconfig)?;

        let inner = Arc::new(ApiServerInner {
            name: name.clone(),
            dir,
            args,
            env: Arc::downgrade(&env),
            binary: env.binaries.kube_apiserver.clone(),
            pki: env.pki.clone(),
            tls: env.tls.clone(),
            handle: env.handle.clone(),
            front_addr,
            backend_addr,
            kubeconfig,
            state: Arc::new(FrontDoorState::default()),
            process: Mutex::new(None),
            front_door: Mutex::new(None),
            own_etcd: Mutex::new(own_etcd),
        });
        lock(&env.apiservers).push(inner.clone());
        let server = ApiServer { inner };
        server.start_inner().await?;
        if options.install_crds {
            server.install_crds().await?;
        }
        Ok(server)
    }

    /// An etcd of this apiserver's own, its data and log in `dir`; returns it and its URL.
    async fn start_own_etcd(
        env: &EnvInner,
        name: &str,
        dir: &Path,
    ) -> Result<(ManagedProcess, String), TestEnvError> {
        let (binary, data, log) = (
            env.binaries.etcd.clone(),
            dir.join("etcd"),
            dir.join("etcd.log"),
        );
        tokio::task::spawn_blocking(move || start_etcd(&binary, &data, &log))
            .await
            .map_err(|e| TestEnvError::Spawn(format!("etcd of {name}"), e.to_string()))?
    }

    /// Name (and etcd prefix) of this apiserver.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The address clients use (the front door).
    pub fn addr(&self) -> SocketAddr {
        self.inner.front_addr
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.inner.front_addr)
    }

    /// Admin kubeconfig (YAML, credentials inline): what a shoot's probe secret holds.
    pub fn kubeconfig(&self) -> &str {
        &self.inner.kubeconfig
    }

    /// Path of the admin kubeconfig file.
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.inner.dir.join("admin.kubeconfig")
    }

    /// Path of the audit log (when started with `audit_log`).
    pub fn audit_log_path(&self) -> PathBuf {
        self.inner.dir.join("audit.log")
    }

    /// A kubeconfig for a user with a fresh client certificate (CN = user, O = groups).
    pub fn kubeconfig_for(&self, user: &str, groups: &[&str]) -> Result<String, TestEnvError> {
        let cert = self.inner.pki.issue_client(user, groups)?;
        Ok(make_kubeconfig(
            &self.inner.name,
            self.inner.front_addr,
            &self.inner.pki.ca_pem(),
            &cert,
        ))
    }

    /// A kubeconfig that authenticates with a bearer token (e.g. a ServiceAccount token).
    pub fn kubeconfig_with_token(&self, token: &str) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: {n}\n  cluster:\n    server: https://{addr}\n    certificate-authority-data: {ca}\nusers:\n- name: token\n  user:\n    token: {token}\ncontexts:\n- name: {n}\n  context:\n    cluster: {n}\n    user: token\ncurrent-context: {n}\n",
            n = self.inner.name,
            addr = self.inner.front_addr,
            ca = b64(&self.inner.pki.ca_pem()),
        )
    }

    /// A new admin client. Build one per test (per tokio runtime): a client's pooled
    /// connections belong to the runtime that made them.
    pub async fn client(&self) -> Result<kube::Client, TestEnvError> {
        client_from_kubeconfig(&self.inner.name, &self.inner.kubeconfig).await
    }

    /// A client for a user with a fresh client certificate.
    pub async fn client_for(
        &self,
        user: &str,
        groups: &[&str],
    ) -> Result<kube::Client, TestEnvError> {
        client_from_kubeconfig(&self.inner.name, &self.kubeconfig_for(user, groups)?).await
    }

    /// Pid of the kube-apiserver process, while running.
    pub fn pid(&self) -> Option<u32> {
        lock(&self.inner.process)
            .as_ref()
            .and_then(ManagedProcess::pid)
    }

    /// Whether the apiserver process runs.
    pub fn is_running(&self) -> bool {
        lock(&self.inner.process).is_some()
    }

    /// Stops the apiserver: the front door closes (connections refused), the process ends.
    pub async fn stop(&self) -> Result<(), TestEnvError> {
        lock(&self.inner.front_door).take();
        let process = lock(&self.inner.process).take();
        if let Some(mut p) = process {
            tokio::task::spawn_blocking(move || p.stop(Duration::from_secs(5)))
                .await
                .map_err(|e| TestEnvError::Spawn("stop apiserver".into(), e.to_string()))?;
        }
        Ok(())
    }

    /// Starts a stopped apiserver again on the same addresses and waits until it is ready.
    pub async fn start(&self) -> Result<(), TestEnvError> {
        let me = self.clone();
        self.inner
            .handle
            .spawn(async move { me.start_inner().await })
            .await
            .map_err(|e| TestEnvError::Spawn("start apiserver".into(), e.to_string()))?
    }

    async fn start_inner(&self) -> Result<(), TestEnvError> {
        let i = &self.inner;
        if i.env
            .upgrade()
            .is_none_or(|e| e.torn_down.load(Ordering::SeqCst))
        {
            return Err(TestEnvError::Spawn(
                i.name.clone(),
                "environment is torn down".into(),
            ));
        }
        if lock(&i.process).is_none() {
            let p = ManagedProcess::spawn(
                &format!("kube-apiserver {}", i.name),
                &i.binary,
                &i.args,
                &i.dir.join("kube-apiserver.log"),
            )?;
            *lock(&i.process) = Some(p);
        }
        if lock(&i.front_door).is_none() {
            let door = FrontDoor::open(
                i.front_addr,
                i.backend_addr,
                i.state.clone(),
                i.tls.clone(),
                &i.handle,
            )
            .await?;
            *lock(&i.front_door) = Some(door);
        }
        self.wait_ready().await
    }

    async fn wait_ready(&self) -> Result<(), TestEnvError> {
        let i = &self.inner;
        let client = self.client().await?;
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last = String::from("no answer yet");
        while Instant::now() < deadline {
            {
                let mut process = lock(&i.process);
                if process.as_mut().is_none_or(ManagedProcess::has_exited) {
                    let tail = process
                        .as_ref()
                        .map(|p| p.log_tail(3000))
                        .unwrap_or_default();
                    return Err(TestEnvError::NotReady {
                        what: format!("kube-apiserver {}", i.name),
                        timeout: READY_TIMEOUT,
                        detail: format!("process exited:\n{tail}"),
                    });
                }
            }
            let request = ::http::Request::get("/readyz").body(Vec::new());
            match request {
                Ok(req) => match client.request_text(req).await {
                    Ok(body) if body.trim() == "ok" => return Ok(()),
                    Ok(body) => last = body,
                    Err(e) => last = e.to_string(),
                },
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let tail = lock(&i.process)
            .as_ref()
            .map(|p| p.log_tail(3000))
            .unwrap_or_default();
        Err(TestEnvError::NotReady {
            what: format!("kube-apiserver {}", i.name),
            timeout: READY_TIMEOUT,
            detail: format!("{last}\n{tail}"),
        })
    }

    /// Makes the front door answer every request with `429 Too Many Requests` (or stop).
    pub fn set_throttled(&self, on: bool) {
        self.inner.state.set_throttled(on);
    }

    /// Makes the front door answer only the next `n` requests with 429, then pass again.
    pub fn throttle_next(&self, n: u64) {
        self.inner.state.throttle_next(n);
    }

    /// The `Retry-After` (whole seconds, `None`: no header) of the front door's 429s; `0`
    /// unless set.
    pub fn set_retry_after(&self, seconds: Option<u32>) {
        self.inner.state.set_retry_after(seconds);
    }

    /// Delays every new connection through the front door (a slow shoot).
    pub fn set_latency(&self, latency: Duration) {
        self.inner.state.set_latency(latency);
    }

    /// How many 429 responses the front door has sent.
    pub fn throttled_responses(&self) -> u64 {
        self.inner.state.throttled_responses()
    }

    /// How many connections the front door has accepted (from every client).
    pub fn connections(&self) -> u64 {
        self.inner.state.connections()
    }

    /// New connections through the front door complete the TLS handshake and then never get
    /// an answer (true), or are served again (false).
    pub fn set_hang_after_handshake(&self, on: bool) {
        self.inner.state.set_hang_after_handshake(on);
    }

    /// Closes every connection open through the front door now (the apiserver keeps
    /// running): with [`ApiServer::set_throttled`], a storm that reaches clients on their
    /// pooled connections too.
    pub fn drop_connections(&self) {
        self.inner.state.drop_connections();
    }

    /// How many connections the front door left hanging after their TLS handshake.
    pub fn hung_connections(&self) -> u64 {
        self.inner.state.hung_connections()
    }

    /// Partitions the front door (true: no byte moves on open or new connections) or heals
    /// it (false: held connections carry on).
    pub fn set_partitioned(&self, on: bool) {
        self.inner.state.set_partitioned(on);
    }

    /// Conflict-on-first-write mode (see [`front_door`]): from now on, new connections reach
    /// the apiserver through the front door as the environment's admin, and the first
    /// `PATCH`/`PUT` to each object is answered `409 Conflict` after a concurrent write of the
    /// front door's own. Connections already open keep being piped. `false` turns it off.
    pub fn set_conflict_on_first_write(&self, on: bool) -> Result<(), TestEnvError> {
        let upstream = if on {
            let env = self.inner.env.upgrade().ok_or_else(|| {
                TestEnvError::Spawn(self.inner.name.clone(), "environment is gone".into())
            })?;
            Some(front_door::upstream_tls_config(
                &self.inner.pki.ca_pem(),
                &env.admin,
            )?)
        } else {
            None
        };
        self.inner.state.set_conflict_on_first_write(upstream);
        Ok(())
    }

    /// How many writes the front door answered `409` in conflict-on-first-write mode.
    pub fn conflicts_sent(&self) -> u64 {
        self.inner.state.conflicts_sent()
    }

    /// Trickled-bodies mode (see [`front_door`]): from now on, new connections reach the
    /// apiserver through the front door as the environment's admin, and the bodies of the
    /// responses `trickle` selects drip out slowly after their headers. `None` turns it off.
    pub fn set_trickle(&self, trickle: Option<front_door::Trickle>) -> Result<(), TestEnvError> {
        let upstream = match trickle {
            Some(t) => Some((t, self.admin_upstream()?)),
            None => None,
        };
        self.inner.state.set_trickle(upstream);
        Ok(())
    }

    /// How many response bodies the front door trickled.
    pub fn trickled_responses(&self) -> u64 {
        self.inner.state.trickled_responses()
    }

    /// How the front door reaches the apiserver as the environment's admin.
    fn admin_upstream(&self) -> Result<Arc<rustls::ClientConfig>, TestEnvError> {
        let env = self.inner.env.upgrade().ok_or_else(|| {
            TestEnvError::Spawn(self.inner.name.clone(), "environment is gone".into())
        })?;
        front_door::upstream_tls_config(&self.inner.pki.ca_pem(), &env.admin)
    }

    /// An admin kubeconfig that reaches the apiserver itself, past the front door: for a
    /// simulated data plane that must stay healthy while the front door is faulty.
    pub fn direct_kubeconfig(&self) -> Result<String, TestEnvError> {
        let cert = self
            .inner
            .pki
            .issue_client("direct-admin", &["system:masters"])?;
        Ok(make_kubeconfig(
            &self.inner.name,
            self.inner.backend_addr,
            &self.inner.pki.ca_pem(),
            &cert,
        ))
    }

    /// A new admin client that reaches the apiserver past the front door.
    pub async fn direct_client(&self) -> Result<kube::Client, TestEnvError> {
        client_from_kubeconfig(&self.inner.name, &self.direct_kubeconfig()?).await
    }

    /// Opens another front door to this apiserver on a port of its own, with switches of its
    /// own: one client's network path (e.g. one replica's) can be faulted while every other
    /// client's stays healthy. It keeps piping while the apiserver is restarted.
    pub async fn side_door(&self) -> Result<SideDoor, TestEnvError> {
        let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, free_port()?));
        let state = Arc::new(FrontDoorState::default());
        let (backend, st, tls, handle) = (
            self.inner.backend_addr,
            state.clone(),
            self.inner.tls.clone(),
            self.inner.handle.clone(),
        );
        let door = self
            .inner
            .handle
            .spawn(async move { FrontDoor::open(addr, backend, st, tls, &handle).await })
            .await
            .map_err(|e| TestEnvError::Spawn("side door".into(), e.to_string()))??;
        let env = self.inner.env.upgrade().ok_or_else(|| {
            TestEnvError::Spawn(self.inner.name.clone(), "environment is gone".into())
        })?;
        let kubeconfig =
            make_kubeconfig(&self.inner.name, addr, &self.inner.pki.ca_pem(), &env.admin);
        Ok(SideDoor {
            addr,
            state,
            kubeconfig,
            upstream: self.admin_upstream()?,
            _door: door,
        })
    }

    /// Installs the Cluster and Machine CRDs and waits until they are established.
    pub async fn install_crds(&self) -> Result<(), TestEnvError> {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let client = self.client().await?;
        let api: Api<CustomResourceDefinition> = Api::all(client);
        let cerr = |e: String| TestEnvError::Client(self.inner.name.clone(), e);
        for yaml in [CLUSTER_CRD_YAML, MACHINE_CRD_YAML] {
            let crd: CustomResourceDefinition =
                serde_saphyr::from_str(yaml).map_err(|e| cerr(format!("parse CRD: {e}")))?;
            match api.create(&PostParams::default(), &crd).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(cerr(format!("create CRD: {e}"))),
            }
            let name = crd.metadata.name.clone().unwrap_or_default();
            let cond = kube::runtime::conditions::is_crd_established();
            tokio::time::timeout(
                READY_TIMEOUT,
                kube::runtime::wait::await_condition(api.clone(), &name, cond),
            )
            .await
            .map_err(|_| cerr(format!("CRD {name} not established in time")))?
            .map_err(|e| cerr(format!("wait for CRD {name}: {e}")))?;
        }
        Ok(())
    }
}

/// Another front door to an apiserver ([`ApiServer::side_door`]); closed on drop.
pub struct SideDoor {
    addr: SocketAddr,
    state: Arc<FrontDoorState>,
    kubeconfig: String,
    /// How this door reaches the apiserver as the admin in the modes that terminate TLS.
    upstream: Arc<rustls::ClientConfig>,
    _door: FrontDoor,
}

impl SideDoor {
    /// The address clients of this door use.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// An admin kubeconfig (credentials inline) through this door.
    pub fn kubeconfig(&self) -> &str {
        &self.kubeconfig
    }

    /// This door's switches (throttle, latency, hang, partition, conflicts).
    pub fn state(&self) -> &FrontDoorState {
        &self.state
    }

    /// Trickled-bodies mode on this door (see [`ApiServer::set_trickle`]).
    pub fn set_trickle(&self, trickle: Option<front_door::Trickle>) {
        self.state
            .set_trickle(trickle.map(|t| (t, self.upstream.clone())));
    }
}

/// Builds a kube client from kubeconfig YAML. kube's default retry of 429/503/504 is off:
/// tests must see exactly what the server answered.
pub async fn client_from_kubeconfig(
    what: &str,
    kubeconfig: &str,
) -> Result<kube::Client, TestEnvError> {
    let cerr = |e: String| TestEnvError::Client(what.to_string(), e);
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig).map_err(|e| cerr(e.to_string()))?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| cerr(e.to_string()))?;
    config.default_retry = false;
    kube::Client::try_from(config).map_err(|e| cerr(e.to_string()))
}

fn make_kubeconfig(name: &str, addr: SocketAddr, ca_pem: &str, user: &CertAndKey) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: https://{addr}\n    certificate-authority-data: {ca}\nusers:\n- name: {name}-user\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\ncontexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: {name}-user\ncurrent-context: {name}\n",
        ca = b64(ca_pem),
        cert = b64(&user.cert_pem),
        key = b64(&user.key_pem),
    )
}

/// Waits until `check` returns `Some`, polling every 50 ms, failing after `timeout` with
/// `what` and the last observation. Tests wait on conditions with deadlines, never on sleeps.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => "condition not met".to_string(),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(format!(
                "timed out after {timeout:?} waiting for {what}: {last}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
