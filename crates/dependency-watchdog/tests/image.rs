//! The container image, run the way a kubelet runs it in a seed.
//!
//! The image is the OCI layout `image/build.sh` writes (built here for this machine's
//! architecture, or taken from `DWD_IMAGE_OCI`). The test reads it as a container runtime does
//! — index, platform manifest, config, layers — unpacks the layers into a root filesystem, adds
//! what the kubelet would mount (the projected ServiceAccount token, `ca.crt` and `namespace` at
//! `/var/run/secrets/kubernetes.io/serviceaccount/`, the ConfigMap at
//! `/etc/dependency-watchdog/config/dep-config.yaml`, `/proc`) and starts Gardener's exact
//! command line (`deploy/gardener/`) in a chroot of that root filesystem, in mount and UTS
//! namespaces of its own (host name = pod name), as the image's user 65532:65532 without
//! capabilities or privilege escalation, with the image's environment and working directory
//! plus the pod's (`HOSTNAME`, `HOME`, `KUBERNETES_SERVICE_HOST`/`_PORT`): in-cluster
//! configuration, exactly as in a pod.
//!
//! Seed: a real kube-apiserver; the credential is a TokenRequest token of
//! `garden/dependency-watchdog-{prober,weeder}` bound to Gardener's RBAC. Shoot: a real
//! kube-apiserver and simulated kubelets (`dwd-sim`); the probe secret carries a token of the
//! shoot's `kube-system/dependency-watchdog-probe` with Gardener's shoot-side RBAC.
//!
//! - The prober takes its Lease, gets ready on the default health port, probes the shoot
//!   successfully, scales its controllers down while 4 of 5 kubelets are silent and back up
//!   when they return, and exits 0 on SIGTERM.
//! - The weeder takes its Lease, gets ready, deletes the crash-looping dependants once a
//!   service's EndpointSlice is ready, and exits 0 on SIGTERM.
//!
//! Needs root (chroot, namespaces, changing uid), as CI and this machine have. Both
//! binaries bind the default ports, so the tests take turns ([`PORTS`]).
//!
//! The other platform's image runs too, emulated: `DWD_IMAGE_ARCH=arm64
//! DWD_IMAGE_EMULATOR=/usr/bin/qemu-aarch64-static` (Debian's qemu-user-static) copies the
//! emulator into each pod's root filesystem and starts the image's binary through it.

// A test crate: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod harness;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use dwd_core::scaling::{MELTDOWN_ANNOTATION, REPLICAS_ANNOTATION};
use dwd_sim::{EndpointsState, SeedControlPlane, SimShoot, SimShootOptions};
use dwd_testenv::metrics::sum;
use dwd_testenv::process::ManagedProcess;
use dwd_testenv::{ApiServer, ApiServerOptions, TestEnv, eventually};
use harness::binary::{Watchdog, http_get};
use harness::gardener::{GARDEN, Gardener, apply, ensure_namespace, fixture, one, shortened};
use harness::in_process::lease_holder;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::Value;

const KCM: &str = "kube-controller-manager";
const MCM: &str = "machine-controller-manager";
const CA: &str = "cluster-autoscaler";
const PROBE_SA: &str = "dependency-watchdog-probe";
const KUBE_SYSTEM: &str = "kube-system";
/// Where Gardener's command line and the image put the binary.
const BINARY: &str = "/usr/local/bin/dependency-watchdog";
/// Where the kubelet mounts the ServiceAccount token volume.
const SERVICE_ACCOUNT_DIR: &str = "var/run/secrets/kubernetes.io/serviceaccount";
/// Where Gardener mounts the ConfigMap.
const CONFIG_DIR: &str = "etc/dependency-watchdog/config";
/// The image's user, distroless's `nonroot`.
const NONROOT: u32 = 65532;
const DEADLINE: Duration = Duration::from_secs(60);
/// The default metrics and health ports, which Gardener's command line leaves in place.
const METRICS_PORT: u16 = 9643;
const HEALTH_PORT: u16 = 9644;

/// Both binaries bind the default ports: one test at a time.
static PORTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

// --- Gardener's objects (deploy/gardener) ---------------------------------------------------

/// A token of `namespace/sa` from the TokenRequest API (what the kubelet projects).
async fn token(admin: &kube::Client, namespace: &str, sa: &str) -> Result<String> {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(3600),
            bound_object_ref: None,
        },
        ..TokenRequest::default()
    };
    let answer: TokenRequest = Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .create_subresource("token", sa, &PostParams::default(), &request)
        .await
        .with_context(|| format!("TokenRequest for {namespace}/{sa}"))?;
    Ok(answer.status.context("TokenRequest without status")?.token)
}

/// The probe kubeconfig Gardener's token requestor writes: the shoot's address and CA, and a
/// token of `kube-system/dependency-watchdog-probe` with Gardener's shoot-side RBAC.
async fn probe_kubeconfig(shoot: &ApiServer) -> Result<String> {
    let admin = shoot.client().await?;
    let docs = fixture("shoot-access.yaml")?;
    let sa: ServiceAccount = serde_json::from_value(serde_json::json!({
        "metadata": {"name": PROBE_SA, "namespace": KUBE_SYSTEM}
    }))?;
    apply(&Api::namespaced(admin.clone(), KUBE_SYSTEM), &sa).await?;
    let lease_ns = "kube-node-lease";
    apply::<Role>(
        &Api::namespaced(admin.clone(), lease_ns),
        &one(&docs, "Role")?,
    )
    .await?;
    apply::<RoleBinding>(
        &Api::namespaced(admin.clone(), lease_ns),
        &one(&docs, "RoleBinding")?,
    )
    .await?;
    apply::<ClusterRole>(&Api::all(admin.clone()), &one(&docs, "ClusterRole")?).await?;
    apply::<ClusterRoleBinding>(&Api::all(admin.clone()), &one(&docs, "ClusterRoleBinding")?)
        .await?;
    let token = token(&admin, KUBE_SYSTEM, PROBE_SA).await?;
    Ok(shoot.kubeconfig_with_token(&token))
}

// --- the image ------------------------------------------------------------------------------

/// This machine's architecture, as OCI names it.
fn host_arch() -> Result<&'static str> {
    match std::env::consts::ARCH {
        "x86_64" => Ok("amd64"),
        "aarch64" => Ok("arm64"),
        other => bail!("no image is built for {other}"),
    }
}

/// The platform under test: `DWD_IMAGE_ARCH` (amd64 or arm64), else this machine's. Another
/// architecture than this machine's needs `DWD_IMAGE_EMULATOR` (e.g.
/// `/usr/bin/qemu-aarch64-static`), which then runs the image's binary inside the chroot.
fn image_arch() -> Result<String> {
    let arch = match std::env::var("DWD_IMAGE_ARCH") {
        Ok(arch) if !arch.is_empty() => arch,
        _ => host_arch()?.to_string(),
    };
    ensure!(
        arch == "amd64" || arch == "arm64",
        "DWD_IMAGE_ARCH={arch}: amd64 or arm64"
    );
    ensure!(
        arch == host_arch()? || emulator().is_some(),
        "the image for {arch} cannot run on {}: set DWD_IMAGE_EMULATOR to a static qemu-user",
        host_arch()?
    );
    Ok(arch)
}

/// A static user-mode emulator for another architecture's image, from `DWD_IMAGE_EMULATOR`.
fn emulator() -> Option<PathBuf> {
    std::env::var_os("DWD_IMAGE_EMULATOR")
        .filter(|e| !e.is_empty())
        .map(PathBuf::from)
}

/// Where a pod's root filesystem gets the emulator (never part of the image).
const EMULATOR_IN_ROOTFS: &str = "/.dwd-emulator";

/// The OCI layout: `DWD_IMAGE_OCI` when set (used as it is), else `target/image/oci`, which
/// `image/build.sh --arch <this machine's>` brings up to date first (a no-op when the binary
/// and the script are unchanged; a release build when the sources changed). Once per process.
fn layout() -> Result<PathBuf> {
    static LAYOUT: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    LAYOUT
        .get_or_init(|| find_or_build_layout().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(|e| anyhow!(e))
}

fn find_or_build_layout() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("DWD_IMAGE_OCI").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        ensure!(
            dir.join("index.json").is_file(),
            "DWD_IMAGE_OCI={} is not an OCI layout (no index.json)",
            dir.display()
        );
        return Ok(dir);
    }
    let out = repo_root().join("target/image/oci");
    let script = repo_root().join("image/build.sh");
    let started = Instant::now();
    let output = Command::new("bash")
        .arg(&script)
        .args(["--arch", &image_arch()?, "--out"])
        .arg(&out)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    let report = String::from_utf8_lossy(&output.stdout);
    eprintln!("image/build.sh ({:.0?}):\n{report}", started.elapsed());
    ensure!(
        output.status.success(),
        "{} failed with {}",
        script.display(),
        output.status
    );
    Ok(out)
}

/// One platform's image in an OCI layout, as a runtime resolves it.
struct Image {
    layout: PathBuf,
    /// The image config (`config` of the config blob holds User, Entrypoint, Env, ...).
    config: Value,
    /// The layer blobs, bottom first, with their media types.
    layers: Vec<(PathBuf, String)>,
    /// Platforms of the tag's index.
    platforms: Vec<String>,
}

fn blob(layout: &Path, digest: &str) -> Result<PathBuf> {
    let hex = digest
        .strip_prefix("sha256:")
        .with_context(|| format!("digest {digest} is not sha256"))?;
    let path = layout.join("blobs/sha256").join(hex);
    ensure!(path.is_file(), "blob {digest} missing from the layout");
    Ok(path)
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&text).with_context(|| format!("parsing {}", path.display()))
}

impl Image {
    /// Resolves tag `tag` (`DWD_IMAGE_TAG`, default the crate version, which is the workspace
    /// version the script tags with) for linux on this machine's architecture.
    fn load(layout: &Path) -> Result<Image> {
        let tag =
            std::env::var("DWD_IMAGE_TAG").unwrap_or_else(|_| env!("CARGO_PKG_VERSION").into());
        let arch = image_arch()?;
        let index = read_json(&layout.join("index.json"))?;
        let top = index["manifests"]
            .as_array()
            .context("index.json without manifests")?
            .iter()
            .find(|d| d["annotations"]["org.opencontainers.image.ref.name"] == tag.as_str())
            .with_context(|| format!("no tag {tag} in {}", layout.display()))?;
        let mut platforms = Vec::new();
        let manifest_digest = match top["mediaType"].as_str() {
            Some("application/vnd.oci.image.index.v1+json") => {
                let image_index = read_json(&blob(layout, top["digest"].as_str().unwrap_or(""))?)?;
                let mut chosen = None;
                for m in image_index["manifests"]
                    .as_array()
                    .context("index without manifests")?
                {
                    let (os, a) = (
                        m["platform"]["os"].as_str().unwrap_or(""),
                        m["platform"]["architecture"].as_str().unwrap_or(""),
                    );
                    platforms.push(format!("{os}/{a}"));
                    if os == "linux" && a == arch {
                        chosen = m["digest"].as_str().map(str::to_string);
                    }
                }
                chosen.with_context(|| format!("tag {tag} has no linux/{arch}: {platforms:?}"))?
            }
            Some("application/vnd.oci.image.manifest.v1+json") => {
                top["digest"].as_str().context("no digest")?.to_string()
            }
            other => bail!("tag {tag} has media type {other:?}"),
        };
        let manifest = read_json(&blob(layout, &manifest_digest)?)?;
        let config = read_json(&blob(
            layout,
            manifest["config"]["digest"].as_str().context("no config")?,
        )?)?;
        ensure!(
            config["os"] == "linux" && config["architecture"] == arch,
            "config for {}/{}, want linux/{arch}",
            config["os"],
            config["architecture"]
        );
        let layers = manifest["layers"]
            .as_array()
            .context("manifest without layers")?
            .iter()
            .map(|l| {
                Ok((
                    blob(
                        layout,
                        l["digest"].as_str().context("layer without digest")?,
                    )?,
                    l["mediaType"].as_str().unwrap_or("").to_string(),
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Image {
            layout: layout.to_path_buf(),
            config,
            layers,
            platforms,
        })
    }

    fn runtime_config(&self) -> &Value {
        &self.config["config"]
    }

    /// `User` as uid and gid (numeric, as the image sets it).
    fn user(&self) -> Result<(u32, u32)> {
        let user = self.runtime_config()["User"]
            .as_str()
            .context("the image sets no User")?;
        let (u, g) = user.split_once(':').unwrap_or((user, user));
        Ok((u.parse()?, g.parse()?))
    }

    fn entrypoint(&self) -> Vec<String> {
        serde_json::from_value(self.runtime_config()["Entrypoint"].clone()).unwrap_or_default()
    }

    fn env(&self) -> Vec<(String, String)> {
        self.runtime_config()["Env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e.as_str()?.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn working_dir(&self) -> String {
        self.runtime_config()["WorkingDir"]
            .as_str()
            .filter(|w| !w.is_empty())
            .unwrap_or("/")
            .to_string()
    }

    /// Unpacks the layers into `rootfs` (owners and modes kept, as a runtime does).
    fn unpack(&self, rootfs: &Path) -> Result<()> {
        std::fs::create_dir_all(rootfs)?;
        for (layer, media_type) in &self.layers {
            let compression = match media_type.as_str() {
                "application/vnd.oci.image.layer.v1.tar+gzip" => "--gzip",
                "application/vnd.oci.image.layer.v1.tar" => "--no-auto-compress",
                other => bail!("layer media type {other} not handled"),
            };
            let status = Command::new("tar")
                .args(["--extract", "--same-permissions", "--same-owner"])
                .args(["--numeric-owner", compression, "--file"])
                .arg(layer)
                .arg("--directory")
                .arg(rootfs)
                .status()?;
            ensure!(status.success(), "unpacking {}: {status}", layer.display());
        }
        Ok(())
    }
}

/// The image of this machine's architecture, built or found once per process.
fn image() -> Result<Image> {
    Image::load(&layout()?)
}

/// Every path of an unpacked root filesystem with its mode, owner and group.
fn tree(rootfs: &Path) -> Result<BTreeMap<String, (u32, u32, u32)>> {
    use std::os::unix::fs::MetadataExt;
    let mut found = BTreeMap::new();
    let mut stack = vec![rootfs.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            let meta = std::fs::symlink_metadata(&path)?;
            let rel = format!("/{}", path.strip_prefix(rootfs)?.display());
            found.insert(rel, (meta.mode() & 0o7777, meta.uid(), meta.gid()));
            if meta.is_dir() {
                stack.push(path);
            }
        }
    }
    Ok(found)
}

// --- a pod of the image ---------------------------------------------------------------------

/// What the kubelet would put into the container: the token volume and the ConfigMap.
struct PodSpec<'a> {
    name: &'a str,
    command: &'a [String],
    config: &'a str,
    token: &'a str,
    seed: &'a ApiServer,
    env: &'a TestEnv,
}

/// Writes into `rootfs` what the kubelet mounts for the pod of `spec`: the projected
/// ServiceAccount volume, the ConfigMap volume, and the `/proc` mount point.
fn write_volumes(rootfs: &Path, spec: &PodSpec<'_>) -> Result<()> {
    // The projected ServiceAccount volume (fsGroup 65532: group-readable) and the
    // ConfigMap volume (0644).
    let sa = rootfs.join(SERVICE_ACCOUNT_DIR);
    std::fs::create_dir_all(&sa)?;
    let ca = std::fs::read_to_string(spec.env.dir().join("ca.crt"))?;
    for (file, content) in [
        ("token", spec.token),
        ("ca.crt", &ca),
        ("namespace", GARDEN),
    ] {
        let path = sa.join(file);
        std::fs::write(&path, content)?;
        std::os::unix::fs::chown(&path, Some(0), Some(NONROOT))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640))?;
    }
    let config_dir = rootfs.join(CONFIG_DIR);
    std::fs::create_dir_all(&config_dir)?;
    std::fs::write(config_dir.join("dep-config.yaml"), spec.config)?;
    std::fs::create_dir_all(rootfs.join("proc"))?;
    Ok(())
}

/// What to execute in `rootfs` for `command`: its binary, or (for an image of another
/// architecture) the emulator, copied into the root filesystem, with the binary as argument.
fn program_in<'a>(rootfs: &Path, command: &'a [String]) -> Result<(&'a str, Option<&'a String>)> {
    Ok(match emulator() {
        None => (command[0].as_str(), None),
        Some(emulator) => {
            let inside = rootfs.join(&EMULATOR_IN_ROOTFS[1..]);
            std::fs::copy(&emulator, &inside)
                .with_context(|| format!("copying {}", emulator.display()))?;
            std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(0o755))?;
            (EMULATOR_IN_ROOTFS, Some(&command[0]))
        }
    })
}

/// The image's binary running in a chroot of the unpacked image; killed on drop. Watched as
/// any other binary under test (`until`, `metrics`, `stop`, `tail`: [`Watchdog`]'s).
struct PodProcess {
    rootfs: PathBuf,
    watchdog: Watchdog,
}

impl std::ops::Deref for PodProcess {
    type Target = Watchdog;
    fn deref(&self) -> &Watchdog {
        &self.watchdog
    }
}

impl PodProcess {
    /// Waits until the pod holds leader-election Lease `lease` (its holder is
    /// `<host name>_<uuid>`: the pod's name, as controller-runtime's) and answers `/readyz`.
    async fn wait_leading_and_ready(
        &self,
        who: &str,
        admin: &kube::Client,
        lease: &str,
    ) -> Result<()> {
        self.until(&format!("{who} leads and is ready"), || async {
            let leads = lease_holder(admin, GARDEN, lease)
                .await?
                .is_some_and(|h| h.starts_with(&format!("{}_", self.name)));
            let ready = http_get(HEALTH_PORT, "/readyz")
                .await
                .map(|(s, _)| s == 200)
                .unwrap_or(false);
            Ok((leads && ready).then_some(()))
        })
        .await
    }

    /// Stops the pod with SIGTERM: it exits 0 and never logged an error.
    async fn stop_cleanly(&self) -> Result<()> {
        let status = self.stop().await?;
        ensure!(status.success(), "exit status {status}\n{}", self.tail());
        let errors = self.errors();
        ensure!(errors.is_empty(), "error lines:\n{}", errors.join("\n"));
        Ok(())
    }

    // `pre_exec` has no safe form: namespaces, chroot and the image's user are set between
    // fork and exec.
    #[allow(unsafe_code)]
    fn start(image: &Image, dir: &Path, spec: PodSpec<'_>) -> Result<PodProcess> {
        let rootfs = dir.join(format!("{}-rootfs", spec.name));
        image.unpack(&rootfs)?;

        write_volumes(&rootfs, &spec)?;

        let command = spec.command;
        ensure!(
            command.first().map(String::as_str) == Some(BINARY),
            "Gardener's command starts with {:?}",
            command.first()
        );
        let (uid, gid) = image.user()?;
        let (program, emulated) = program_in(&rootfs, command)?;
        let builder = ManagedProcess::builder(spec.name, program)
            .args(emulated)
            .args(&command[1..])
            .env_clear()
            .envs(image.env())
            // What the kubelet adds: the pod's host name, HOME from the image's passwd, and the
            // `kubernetes` Service of the seed.
            .env("HOSTNAME", spec.name)
            .env("HOME", "/home/nonroot")
            .env("KUBERNETES_SERVICE_HOST", spec.seed.addr().ip().to_string())
            .env(
                "KUBERNETES_SERVICE_PORT",
                spec.seed.addr().port().to_string(),
            )
            .env(
                "KUBERNETES_SERVICE_PORT_HTTPS",
                spec.seed.addr().port().to_string(),
            )
            .log(dir.join(format!("{}.log", spec.name)));

        let root = CString::new(rootfs.as_os_str().as_bytes())?;
        let proc_dir = CString::new(rootfs.join("proc").as_os_str().as_bytes())?;
        let workdir = CString::new(image.working_dir())?;
        let hostname = CString::new(spec.name)?;
        // SAFETY: between fork and exec the closure only makes system calls (no allocation, no
        // locks): private mount and UTS namespaces (/proc; the pod's name as host name), chroot,
        // the image's user without capabilities or new privileges. ManagedProcess sets the
        // death-with-the-test-process signal after it, once the uid change can no longer clear
        // it.
        let builder = unsafe {
            builder.pre_exec(move || {
                let check = |r: libc::c_int| {
                    if r == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                };
                check(libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWUTS))?;
                check(libc::sethostname(
                    hostname.as_ptr(),
                    hostname.as_bytes().len(),
                ))?;
                check(libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ))?;
                check(libc::mount(
                    c"proc".as_ptr(),
                    proc_dir.as_ptr(),
                    c"proc".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    std::ptr::null(),
                ))?;
                check(libc::chroot(root.as_ptr()))?;
                check(libc::chdir(workdir.as_ptr()))?;
                let groups = [gid as libc::gid_t];
                check(libc::setgroups(1, groups.as_ptr()))?;
                check(libc::setresgid(gid, gid, gid))?;
                check(libc::setresuid(uid, uid, uid))?;
                check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
                Ok(())
            })
        };
        let process = builder
            .spawn()
            .with_context(|| format!("starting {} in {}", spec.name, rootfs.display()))?;
        Ok(PodProcess {
            rootfs,
            watchdog: Watchdog::with_process(spec.name, process, METRICS_PORT),
        })
    }

    /// The process runs as the image's user, without capabilities, inside the root filesystem.
    fn check_confinement(&self) -> Result<()> {
        let pid = self.pid().context("no process")?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name}:")))
                .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
                .unwrap_or_default()
        };
        let ids = format!("{NONROOT} {NONROOT} {NONROOT} {NONROOT}");
        ensure!(field("Uid") == ids, "Uid: {}", field("Uid"));
        ensure!(field("Gid") == ids, "Gid: {}", field("Gid"));
        ensure!(
            field("Groups") == NONROOT.to_string(),
            "Groups: {}",
            field("Groups")
        );
        ensure!(
            field("CapEff") == "0000000000000000",
            "CapEff: {}",
            field("CapEff")
        );
        ensure!(
            field("NoNewPrivs") == "1",
            "NoNewPrivs: {}",
            field("NoNewPrivs")
        );
        let root = std::fs::read_link(format!("/proc/{pid}/root"))?;
        ensure!(
            root == std::fs::canonicalize(&self.rootfs)?,
            "root {} is not the image's root filesystem",
            root.display()
        );
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))?;
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let (want_exe, binary_arg) = match emulator() {
            None => (BINARY, 0),
            Some(_) => (EMULATOR_IN_ROOTFS, 1),
        };
        ensure!(
            exe == std::fs::canonicalize(self.rootfs.join(&want_exe[1..]))?
                && args.get(binary_arg) == Some(&BINARY.as_bytes()),
            "runs {} {:?}, not the image's binary",
            exe.display(),
            String::from_utf8_lossy(&cmdline)
        );
        Ok(())
    }

    /// Log lines at error level or above (zap JSON).
    fn errors(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter(|line| match serde_json::from_str::<Value>(line) {
                Ok(v) => matches!(
                    v["level"].as_str(),
                    Some("error" | "dpanic" | "panic" | "fatal")
                ),
                Err(_) => true,
            })
            .map(str::to_string)
            .collect()
    }
}

/// Waits until nothing (e.g. another test binary's watchdog) holds the default ports.
async fn default_ports_free() -> Result<()> {
    eventually(DEADLINE, "ports 9643 and 9644 free", || async {
        let free = [METRICS_PORT, HEALTH_PORT]
            .iter()
            .all(|p| std::net::TcpListener::bind(("0.0.0.0", *p)).is_ok());
        Ok(free.then_some(()))
    })
    .await
    .map_err(|e| anyhow!(e))
}

async fn replicas(
    admin: &kube::Client,
    ns: &str,
    name: &str,
) -> Result<(i32, BTreeMap<String, String>)> {
    let d = Api::<Deployment>::namespaced(admin.clone(), ns)
        .get(name)
        .await?;
    Ok((
        d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
        d.metadata.annotations.unwrap_or_default(),
    ))
}

/// A seed kube-apiserver of its own (CRDs installed, `garden` namespace) and Gardener's
/// identity for `role`: the token the kubelet would project.
async fn seed_for(
    env: &TestEnv,
    role: &str,
) -> Result<(ApiServer, kube::Client, Gardener, String)> {
    let seed = env
        .start_apiserver_with(&format!("image-{role}-seed"), ApiServerOptions::seed())
        .await?;
    let admin = seed.client().await?;
    ensure_namespace(&admin, GARDEN).await?;
    let gardener = Gardener::load(role)?;
    gardener.apply_rbac(&admin).await?;
    let sa = gardener.service_account()?.name_any();
    let token = token(&admin, GARDEN, &sa).await?;
    Ok((seed, admin, gardener, token))
}

// --- the tests ------------------------------------------------------------------------------

/// `binary` is a 64-bit little-endian ELF for `arch` that needs no program interpreter.
fn check_static_binary(binary: &Path, arch: &str) -> Result<()> {
    // A static binary: no program interpreter (PT_INTERP) to find in a root filesystem
    // without libc.
    let elf = std::fs::read(binary)?;
    ensure!(elf.starts_with(b"\x7fELF\x02\x01"), "not a 64-bit ELF");
    let machine = u16::from_le_bytes(elf[0x12..0x14].try_into()?);
    let want_machine = if arch == "amd64" { 0x3e } else { 0xb7 };
    ensure!(
        machine == want_machine,
        "ELF machine {machine:#x}, want {want_machine:#x} for {arch}"
    );
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into()?) as usize;
    let phentsize = u16::from_le_bytes(elf[0x36..0x38].try_into()?) as usize;
    let phnum = u16::from_le_bytes(elf[0x38..0x3a].try_into()?) as usize;
    for i in 0..phnum {
        let p_type = u32::from_le_bytes(elf[phoff + i * phentsize..][..4].try_into()?);
        ensure!(
            p_type != 3,
            "the binary asks for a program interpreter (not static)"
        );
    }
    Ok(())
}

#[test]
fn image_is_a_distroless_like_nonroot_image_with_the_binary_at_gardeners_path() -> Result<()> {
    let image = image()?;
    let arch = image_arch()?;
    ensure!(
        image.platforms.is_empty() || image.platforms.contains(&format!("linux/{arch}")),
        "platforms {:?}",
        image.platforms
    );
    ensure!(
        image.user()? == (NONROOT, NONROOT),
        "User {:?}",
        image.user()?
    );
    ensure!(
        image.entrypoint() == [BINARY],
        "Entrypoint {:?}",
        image.entrypoint()
    );
    ensure!(image.working_dir() == "/home/nonroot");
    let env: BTreeMap<_, _> = image.env().into_iter().collect();
    ensure!(
        env.get("SSL_CERT_FILE").map(String::as_str) == Some("/etc/ssl/certs/ca-certificates.crt"),
        "Env {env:?}"
    );
    let labels = &image.runtime_config()["Labels"];
    ensure!(
        labels["org.opencontainers.image.version"] == env!("CARGO_PKG_VERSION"),
        "Labels {labels}"
    );
    ensure!(image.layers.len() == 1, "{} layers", image.layers.len());

    // Exactly distroless's skeleton plus the binary, with distroless's owners and modes.
    let dir = tempdir("image-tree")?;
    let rootfs = dir.join("rootfs");
    image.unpack(&rootfs)?;
    let found = tree(&rootfs)?;
    let want: BTreeMap<String, (u32, u32, u32)> = [
        ("/etc", 0o755, 0),
        ("/etc/group", 0o644, 0),
        ("/etc/passwd", 0o644, 0),
        ("/etc/ssl", 0o755, 0),
        ("/etc/ssl/certs", 0o755, 0),
        ("/etc/ssl/certs/ca-certificates.crt", 0o644, 0),
        ("/home", 0o755, 0),
        ("/home/nonroot", 0o700, NONROOT),
        ("/tmp", 0o1777, 0),
        ("/usr", 0o755, 0),
        ("/usr/local", 0o755, 0),
        ("/usr/local/bin", 0o755, 0),
        ("/usr/local/bin/dependency-watchdog", 0o755, 0),
    ]
    .into_iter()
    .map(|(p, mode, owner)| (p.to_string(), (mode, owner, owner)))
    .collect();
    ensure!(
        found == want,
        "root filesystem:\n{found:#?}\nwant:\n{want:#?}"
    );
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd"))?;
    ensure!(passwd.contains("\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"));
    let group = std::fs::read_to_string(rootfs.join("etc/group"))?;
    ensure!(group.contains("\nnonroot:x:65532:\n"));
    let bundle = std::fs::read_to_string(rootfs.join("etc/ssl/certs/ca-certificates.crt"))?;
    ensure!(
        bundle.matches("BEGIN CERTIFICATE").count() > 100,
        "the CA bundle holds {} certificates",
        bundle.matches("BEGIN CERTIFICATE").count()
    );
    check_static_binary(&rootfs.join(&BINARY[1..]), &arch)?;
    eprintln!(
        "image {} for linux/{arch}: {found:#?}",
        image.layout.display()
    );
    Ok(())
}

/// A scratch directory removed on drop.
fn tempdir(name: &str) -> Result<TempDir> {
    let dir = std::env::temp_dir().join(format!("dwd-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(TempDir(dir))
}

struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Shoot `ns`'s failed API-server and lease probes in the /metrics text `m`.
fn probe_failures(m: &str, ns: &str) -> f64 {
    sum(
        m,
        "dwd_prober_api_server_probe_failures_total",
        &[("shoot", ns)],
    ) + sum(m, "dwd_prober_lease_probe_failures_total", &[("shoot", ns)])
}

/// The leader gauge, and process_* read from the /proc a container has, are above 0. (Under an
/// emulator /proc/self/stat is qemu's synthetic one, with no RSS; /proc/self/fd is real.)
async fn check_prober_leader_and_process_metrics(pod: &PodProcess) -> Result<()> {
    let m = pod.metrics().await?;
    let mut positive = vec![
        (
            "leader_election_master_status",
            &[("name", "dwd-prober-leader-election")][..],
        ),
        ("process_open_fds", &[][..]),
    ];
    if emulator().is_none() {
        positive.push(("process_resident_memory_bytes", &[][..]));
    }
    for (metric, labels) in positive {
        ensure!(
            sum(&m, metric, labels) > 0.0,
            "{metric} {labels:?} not above 0"
        );
    }
    Ok(())
}

#[tokio::test]
async fn prober_from_the_image_protects_a_shoot_under_gardeners_rbac_and_command_line() -> Result<()>
{
    let image = tokio::task::spawn_blocking(image).await??;
    let _ports = PORTS.lock().await;
    let env = TestEnv::shared().await?;
    let (seed, admin, gardener, token) = seed_for(env, "prober").await?;

    // A shoot with 5 nodes; its probe secret carries the probe identity's token.
    let shoot_api = env.start_apiserver("image-prober-shoot").await?;
    let ns = "shoot--garden--image";
    let shoot = SimShoot::create(
        admin.clone(),
        shoot_api.client().await?,
        &probe_kubeconfig(&shoot_api).await?,
        SimShootOptions::new(ns)
            .with_nodes(5)
            .with_renew_interval(Duration::from_millis(500)),
    )
    .await?;

    default_ports_free().await?;
    let dir = env.dir().join("image-test");
    std::fs::create_dir_all(&dir)?;
    let command = gardener.command()?;
    let pod = PodProcess::start(
        &image,
        &dir,
        PodSpec {
            name: "dependency-watchdog-prober-5d4c7b9f8-k8r2m",
            command: &command,
            config: &shortened(&gardener.config()?, Duration::from_secs(3))?,
            token: &token,
            seed: &seed,
            env,
        },
    )?;
    pod.wait_leading_and_ready("the prober", &admin, "dwd-prober-leader-election")
        .await?;
    pod.check_confinement()?;

    // Healthy: successful probe runs (the leases alone show all is well: result ScaleUp).
    pod.until("3 successful probe runs", || async {
        let m = pod.metrics().await?;
        let runs = sum(&m, "dwd_prober_shoot_probe_runs_total", &[("shoot", ns)]);
        let healthy = sum(&m, "dwd_prober_probe_runs_total", &[("result", "ScaleUp")]);
        Ok((runs >= 3.0 && healthy >= 3.0).then_some(()))
    })
    .await?;
    check_prober_leader_and_process_metrics(&pod).await?;

    // Outage: 4 of 5 kubelets silent → KCM, MCM and CA scaled to 0, their replicas recorded.
    let silenced = shoot.kubelets().silence_count(4);
    ensure!(silenced.len() == 4);
    pod.until("KCM, MCM and CA at 0", || async {
        let mut all = true;
        for target in [KCM, MCM, CA] {
            all &= replicas(&admin, ns, target).await?.0 == 0;
        }
        Ok(all.then_some(()))
    })
    .await?;
    for (target, recorded) in [(KCM, "2"), (MCM, "1"), (CA, "1")] {
        let (_, annotations) = replicas(&admin, ns, target).await?;
        ensure!(
            annotations.get(REPLICAS_ANNOTATION).map(String::as_str) == Some(recorded)
                && annotations.contains_key(MELTDOWN_ANNOTATION),
            "{target} annotations during the outage: {annotations:?}"
        );
    }

    // The kubelets are back → the targets come back to their recorded replicas.
    shoot.kubelets().resume_all();
    pod.until("KCM 2, MCM 1, CA 1 without annotations", || async {
        let mut all = true;
        for (target, want) in [(KCM, 2), (MCM, 1), (CA, 1)] {
            let (r, annotations) = replicas(&admin, ns, target).await?;
            all &= r == want
                && !annotations.contains_key(MELTDOWN_ANNOTATION)
                && !annotations.contains_key(REPLICAS_ANNOTATION);
        }
        Ok(all.then_some(()))
    })
    .await?;
    let m = pod.metrics().await?;
    let failures = probe_failures(&m, ns);
    ensure!(failures == 0.0, "{failures} probe failures\n{}", pod.tail());

    pod.stop_cleanly().await
}

#[tokio::test]
async fn weeder_from_the_image_restarts_crash_looping_dependants_under_gardeners_rbac() -> Result<()>
{
    let image = tokio::task::spawn_blocking(image).await??;
    let _ports = PORTS.lock().await;
    let env = TestEnv::shared().await?;
    let (seed, admin, gardener, token) = seed_for(env, "weeder").await?;

    let ns = "shoot--garden--image-weeder";
    let plane = SeedControlPlane::new(admin.clone(), ns);
    plane.create_namespace().await?;
    let controlplane = ("gardener.cloud/role", "controlplane");
    plane
        .create_crashlooping_pod(
            "kube-apiserver-7d9c",
            &[controlplane, ("role", "apiserver")],
        )
        .await?;
    plane
        .create_crashlooping_pod(
            "kube-controller-manager-5f6d",
            &[controlplane, ("role", "controller-manager")],
        )
        .await?;
    plane
        .set_endpoint_slice("etcd-main-client", 1, EndpointsState::NotReady)
        .await?;
    plane
        .set_endpoint_slice("kube-apiserver", 1, EndpointsState::NotReady)
        .await?;

    default_ports_free().await?;
    let dir = env.dir().join("image-test");
    std::fs::create_dir_all(&dir)?;
    let command = gardener.command()?;
    // Gardener's weeder config as it is.
    let pod = PodProcess::start(
        &image,
        &dir,
        PodSpec {
            name: "dependency-watchdog-weeder-6c8f9d7b4-w7x4p",
            command: &command,
            config: &gardener.config()?,
            token: &token,
            seed: &seed,
            env,
        },
    )?;
    pod.wait_leading_and_ready("the weeder", &admin, "dwd-weeder-leader-election")
        .await?;
    pod.check_confinement()?;

    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let exists = |name: &'static str| {
        let pods = pods.clone();
        async move { Ok::<_, anyhow::Error>(pods.get_opt(name).await?.is_some()) }
    };
    // etcd back → its dependant, the crash-looping kube-apiserver pod, goes; KCM's stays.
    plane
        .set_endpoint_slice("etcd-main-client", 1, EndpointsState::AllReady)
        .await?;
    pod.until("kube-apiserver pod deleted", || async {
        Ok((!exists("kube-apiserver-7d9c").await?).then_some(()))
    })
    .await?;
    ensure!(
        exists("kube-controller-manager-5f6d").await?,
        "KCM pod deleted for etcd"
    );
    // kube-apiserver back → the controller-manager pod goes.
    plane
        .set_endpoint_slice("kube-apiserver", 1, EndpointsState::AllReady)
        .await?;
    pod.until("kube-controller-manager pod deleted", || async {
        Ok((!exists("kube-controller-manager-5f6d").await?).then_some(()))
    })
    .await?;
    // The weeder counts a deletion once the apiserver answered it: the pod can be seen gone
    // a moment before the counter moves.
    pod.until("dwd_weeder_pods_deleted_total ≥ 2", || async {
        let m = pod.metrics().await?;
        Ok((sum(&m, "dwd_weeder_pods_deleted_total", &[]) >= 2.0).then_some(()))
    })
    .await?;

    pod.stop_cleanly().await
}
