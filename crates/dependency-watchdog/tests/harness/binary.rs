//! Running the real `dependency-watchdog` binary from integration tests: a
//! [`ManagedProcess`] with its log in a file, killed on drop (and by the kernel if the test
//! process dies first), its `/metrics` read over HTTP.

// Test helpers: a failed assumption is a failed test (outside tests the workspace denies these).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(dead_code)]

use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use dwd_testenv::eventually;
use dwd_testenv::process::{ManagedProcess, Signal};
use serde_json::Value;

/// How long a condition on a running binary may take.
pub(crate) const DEADLINE: Duration = Duration::from_secs(60);
/// How long the binary may take to exit after SIGTERM.
pub(crate) const EXIT_TIMEOUT: Duration = Duration::from_secs(15);

/// The real binary; killed on drop (a [`ManagedProcess`]).
pub(crate) struct Watchdog {
    pub(crate) name: String,
    process: ManagedProcess,
    metrics_port: u16,
}

impl Watchdog {
    /// Starts the binary with `args` and `env` (`RUST_LOG`, `POD_NAME` and `POD_NAMESPACE`
    /// removed unless given), its stdout and stderr in `<dir>/<name>.log`; its metrics are
    /// read from `metrics_port`. The binary is this crate's, or the one `DWD_TEST_BINARY`
    /// names: the mutation rows of docs/faults.md run a scenario against an older build.
    pub(crate) fn spawn(
        name: &str,
        args: &[String],
        env: &[(&str, &str)],
        dir: &Path,
        metrics_port: u16,
    ) -> Result<Watchdog> {
        let binary = std::env::var("DWD_TEST_BINARY")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_dependency-watchdog").to_string());
        let process = ManagedProcess::builder(name, binary)
            .args(args)
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .env_remove("RUST_LOG")
            .envs(env.iter().copied())
            .log(dir.join(format!("{name}.log")))
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(Watchdog::with_process(name, process, metrics_port))
    }

    /// A binary started some other way (e.g. confined like a pod), watched the same way; its
    /// metrics are read from `metrics_port`.
    pub(crate) fn with_process(name: &str, process: ManagedProcess, metrics_port: u16) -> Watchdog {
        Watchdog {
            name: name.to_string(),
            process,
            metrics_port,
        }
    }

    /// Everything it wrote so far.
    pub(crate) fn log(&self) -> String {
        self.process.log()
    }

    /// The last lines of the log, for error messages.
    pub(crate) fn tail(&self) -> String {
        let text = self.log();
        let lines: Vec<&str> = text.lines().collect();
        let start = lines.len().saturating_sub(40);
        format!(
            "--- {} log tail ---\n{}",
            self.name,
            lines[start..].join("\n")
        )
    }

    /// `Some(status)` once the process ended.
    pub(crate) fn exited(&self) -> Option<ExitStatus> {
        self.process.exit_status()
    }

    /// Its process id.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Its `/metrics` text.
    pub(crate) async fn metrics(&self) -> Result<String> {
        let (status, body) = http_get(self.metrics_port, "/metrics").await?;
        ensure!(status == 200, "{}: /metrics answered {status}", self.name);
        Ok(body)
    }

    /// `GET path` on its metrics port: status and body (e.g. `/debug/decisions?shoot=…`).
    pub(crate) async fn get(&self, path: &str) -> Result<(u16, String)> {
        http_get(self.metrics_port, path).await
    }

    /// Waits until `check` yields a value, failing early when the process exited.
    pub(crate) async fn until<T, F, Fut>(&self, what: &str, mut check: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Option<T>>>,
    {
        eventually(DEADLINE, what, || {
            let exited = self.exited();
            let fut = check();
            async move {
                if let Some(status) = exited {
                    return Err(format!("exited with {status}"));
                }
                fut.await.map_err(|e| format!("{e:#}"))
            }
        })
        .await
        .map_err(|e| anyhow!("{e}\n{}", self.tail()))
    }

    /// SIGTERM, then waits for the exit.
    pub(crate) async fn stop(&self) -> Result<ExitStatus> {
        self.signal(Signal::TERM)?;
        self.wait_exit(EXIT_TIMEOUT).await
    }

    /// Sends `signal` unless the process already ended.
    pub(crate) fn signal(&self, signal: Signal) -> Result<()> {
        self.process
            .signal(signal)
            .with_context(|| format!("signal {signal:?} to {}", self.name))
    }

    /// Waits at most `timeout` for the process to end.
    pub(crate) async fn wait_exit(&self, timeout: Duration) -> Result<ExitStatus> {
        match self.process.wait_exit(timeout).await {
            Some(status) => Ok(status),
            None => bail!(
                "{} did not exit within {timeout:?}\n{}",
                self.name,
                self.tail()
            ),
        }
    }

    /// Waits until at least `n` lines of the log contain `needle` (backslashes ignored: error
    /// messages are quoted in some lines). A denied call is logged on one line per attempt by
    /// the code that retries it, so `n` lines of a denial mean `n` attempts.
    pub(crate) async fn wait_log(&self, needle: &str, n: usize) -> Result<()> {
        self.wait_log_lines(&[needle], n).await
    }

    /// Waits until at least `n` lines of the log contain every one of `needles` (backslashes
    /// ignored).
    pub(crate) async fn wait_log_lines(&self, needles: &[&str], n: usize) -> Result<()> {
        let what = format!("{n} lines with {needles:?} in the log of {}", self.name);
        self.until(&what, || async move {
            let log = self.log().replace('\\', "");
            let lines = log
                .lines()
                .filter(|l| needles.iter().all(|n| l.contains(n)))
                .count();
            Ok((lines >= n).then_some(()))
        })
        .await
    }

    /// The value of one series (0 when absent: counters and families start without series).
    pub(crate) async fn sample(&self, name: &str, labels: &[(&str, &str)]) -> Result<f64> {
        Ok(sample(&self.metrics().await?, name, labels).unwrap_or(0.0))
    }

    /// Waits until a series reaches `min`.
    pub(crate) async fn wait_sample(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        min: f64,
    ) -> Result<()> {
        let what = format!("{name}{labels:?} ≥ {min} on {}", self.name);
        self.until(&what, || async move {
            let value = self.sample(name, labels).await?;
            Ok((value >= min).then_some(()))
        })
        .await
    }

    /// Log lines at warn level or above (JSON `"level":"warn"`/`"error"`, or text `WARN`/`ERROR`).
    pub(crate) fn warnings(&self) -> Vec<String> {
        self.log()
            .lines()
            .filter(|line| match serde_json::from_str::<Value>(line) {
                Ok(v) => matches!(
                    v["level"].as_str().map(str::to_ascii_lowercase).as_deref(),
                    Some("warn" | "warning" | "error" | "dpanic" | "panic" | "fatal")
                ),
                Err(_) => line.contains(" WARN ") || line.contains(" ERROR "),
            })
            .map(str::to_string)
            .collect()
    }
}

/// `GET path` on 127.0.0.1:`port`: status and body (the workspace's one HTTP GET).
pub(crate) async fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    Ok(dwd_testenv::http::get(addr, path, Duration::from_secs(10)).await?)
}

/// Prometheus text, read with the workspace's one parser (each test crate uses some of it).
#[allow(unused_imports)]
pub(crate) use dwd_testenv::metrics::{sample, sum};
