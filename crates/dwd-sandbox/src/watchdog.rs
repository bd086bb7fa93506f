//! The real `dependency-watchdog` binary, run as two subprocesses (prober and weeder) with
//! Gardener's configurations, intervals shortened so the story fits in a minute (see
//! `config.rs`).
//!
//! The sandbox deliberately runs the binary an operator would deploy, not the library
//! in-process: what the user watches is exactly what runs in a seed.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use dwd_testenv::process::{ManagedProcess, log_tail};

use crate::journal::{Journal, lock};
use crate::metrics::http_get;

/// The workspace root this sandbox was built from, if it is still there.
fn workspace_root() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = root.canonicalize().unwrap_or(root);
    root.join("Cargo.toml").is_file().then_some(root)
}

/// Newest modification time of any file under `dir`.
fn newest_mtime(dir: &Path) -> Option<SystemTime> {
    let mut newest = None;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(modified) = entry.metadata().and_then(|m| m.modified()) {
                newest = newest.max(Some(modified));
            }
        }
    }
    newest
}

/// Whether the binary at `bin` is older than the sources it is built from (then a user who
/// just changed the prober would otherwise watch the old one).
fn is_stale(bin: &Path, root: &Path) -> bool {
    let Ok(built) = std::fs::metadata(bin).and_then(|m| m.modified()) else {
        return true;
    };
    ["crates/dependency-watchdog", "crates/dwd-core"]
        .iter()
        .filter_map(|c| newest_mtime(&root.join(c)))
        .any(|source| source > built)
}

/// Finds the `dependency-watchdog` binary: `$DWD_WATCHDOG_BIN`, else next to this
/// executable (where cargo puts both); builds it with cargo when it is missing or older than
/// its sources and the workspace is at hand.
pub(crate) fn locate_binary(journal: &Journal) -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("DWD_WATCHDOG_BIN") {
        let bin = PathBuf::from(bin);
        if !bin.is_file() {
            bail!("DWD_WATCHDOG_BIN={} is not a file", bin.display());
        }
        journal.say(&format!(
            "using dependency-watchdog {} (from DWD_WATCHDOG_BIN)",
            bin.display()
        ));
        return Ok(bin);
    }
    let exe = std::env::current_exe().context("locate the dwd-sandbox executable")?;
    let exe_dir = exe
        .parent()
        .context("the dwd-sandbox executable has no directory")?;
    // Integration tests run from target/<profile>/deps; the binaries live one level up.
    let profile_dir = if exe_dir.ends_with("deps") {
        exe_dir.parent().unwrap_or(exe_dir)
    } else {
        exe_dir
    };
    let bin = profile_dir.join("dependency-watchdog");
    let root = workspace_root();
    let reason = match (&root, bin.is_file()) {
        (_, false) => "it is not built yet",
        (Some(root), true) if is_stale(&bin, root) => "it is older than its sources",
        _ => {
            journal.say(&format!("using dependency-watchdog {}", bin.display()));
            return Ok(bin);
        }
    };
    let Some(root) = root else {
        bail!(
            "no dependency-watchdog binary next to {} and no workspace to build it from; \
             build it (cargo build -p dependency-watchdog) or set DWD_WATCHDOG_BIN",
            exe.display()
        );
    };
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    journal.say(&format!(
        "building dependency-watchdog ({reason}): cargo build -p dependency-watchdog{} (in {})",
        if release { " --release" } else { "" },
        root.display()
    ));
    // Progress and diagnostics go to the terminal; the path comes from cargo's own report
    // (whatever target dir the environment chose).
    let built =
        dwd_testenv::cargo::build_bin(&root, "dependency-watchdog", "dependency-watchdog", release)
            .context("build dependency-watchdog")?;
    journal.say(&format!("using dependency-watchdog {}", built.display()));
    Ok(built)
}

/// One running `dependency-watchdog` subcommand; killed when dropped.
pub(crate) struct Watchdog {
    /// `prober` or `weeder`.
    pub component: &'static str,
    /// Combined stdout and stderr.
    pub log: PathBuf,
    /// `--metrics-bind-addr`.
    pub metrics: SocketAddr,
    /// `--health-bind-addr`.
    pub health: SocketAddr,
    process: std::sync::Mutex<ManagedProcess>,
}

impl Watchdog {
    /// Starts `dependency-watchdog <component>` with `config` against the seed `kubeconfig`,
    /// metrics and health on free loopback ports, output to `<dir>/<component>.log`.
    pub(crate) fn spawn(
        bin: &Path,
        component: &'static str,
        config: &Path,
        kubeconfig: &Path,
        dir: &Path,
    ) -> Result<Watchdog> {
        let metrics = SocketAddr::from((Ipv4Addr::LOCALHOST, dwd_testenv::free_port()?));
        let health = SocketAddr::from((Ipv4Addr::LOCALHOST, dwd_testenv::free_port()?));
        let log = dir.join(format!("{component}.log"));
        let args = vec![
            component.to_string(),
            format!("--config-file={}", config.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--metrics-bind-addr={metrics}"),
            format!("--health-bind-addr={health}"),
            // The sandbox is the only client of its seed: no need to ration requests.
            "--kube-api-qps=50".into(),
            "--kube-api-burst=100".into(),
            "--zap-log-level=info".into(),
        ];
        let process = ManagedProcess::spawn(
            &format!("dependency-watchdog {component}"),
            bin,
            &args,
            &log,
        )
        .with_context(|| format!("start dependency-watchdog {component}"))?;
        Ok(Watchdog {
            component,
            log,
            metrics,
            health,
            process: std::sync::Mutex::new(process),
        })
    }

    /// Process id while running.
    pub(crate) fn pid(&self) -> Option<u32> {
        lock(&self.process).pid()
    }

    /// Whether the process has exited.
    pub(crate) fn has_exited(&self) -> bool {
        lock(&self.process).has_exited()
    }

    /// The end of its log, for error messages.
    pub(crate) fn log_tail(&self, bytes: usize) -> String {
        log_tail(&self.log, bytes)
    }

    /// `log <path>:` and the log's last 3000 bytes: what a message about its failure ends with.
    fn log_excerpt(&self) -> String {
        format!("log {}:\n{}", self.log.display(), self.log_tail(3000))
    }

    /// Fails, naming the process and ending with its log, if it has exited; `when` says when
    /// it was found exited (e.g. ` during startup`, or nothing).
    pub(crate) fn check_running(&self, when: &str) -> Result<()> {
        if self.has_exited() {
            bail!(
                "dependency-watchdog {} exited{when}; {}",
                self.component,
                self.log_excerpt()
            );
        }
        Ok(())
    }

    /// Waits until `/readyz` answers 200 (caches synced), failing if the process exits.
    ///
    /// Returns `Ok(None)` when ready, `Ok(Some(last answer))` when `/readyz` still refused
    /// after `timeout` but the process is alive (`/healthz` 200): readiness is a secondary
    /// signal, so the sandbox goes on and lets the story judge what the watchdog does.
    pub(crate) async fn wait_ready(&self, timeout: Duration) -> Result<Option<String>> {
        let deadline = Instant::now() + timeout;
        let mut last = String::from("no answer yet");
        while Instant::now() < deadline {
            self.check_running(" during startup")?;
            match http_get(self.health, "/readyz", Duration::from_secs(1)).await {
                Ok((200, _)) => return Ok(None),
                Ok((code, body)) => last = format!("HTTP {code}: {}", body.trim()),
                Err(e) => last = format!("{e:#}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        match http_get(self.health, "/healthz", Duration::from_secs(1)).await {
            Ok((200, _)) => Ok(Some(last)),
            _ => bail!(
                "dependency-watchdog {} neither ready nor alive within {timeout:?} (/readyz: {last}); {}",
                self.component,
                self.log_excerpt()
            ),
        }
    }

    /// SIGTERM, then SIGKILL after a short grace period; reaps the process.
    pub(crate) fn stop(&self) {
        lock(&self.process).stop(Duration::from_secs(3));
    }
}
