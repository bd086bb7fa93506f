//! The reference dependency-watchdog (Gardener's v1.7.0) as a binary for tests that run it
//! next to ours (the shadow-mode test of `dwd-parity`).
//!
//! [`binary`] finds it, in this order: `DWD_REFERENCE_BIN` (a pre-built binary; nothing is
//! built); the per-user cache, `<cache>/reference-v1.7.0/dependency-watchdog` with `<cache>`
//! as `testenv/build.sh` chooses it (`DWD_CONTROLPLANE_CACHE`, else
//! `$XDG_CACHE_HOME/dependency-watchdog`, else `~/.cache/dependency-watchdog`); else it builds
//! it there with `crates/dwd-bench/build-reference.sh` (curl, unzip and Go; minutes, once per
//! machine). Concurrent builders (two test binaries, CI's up-front step) wait on a lock file
//! instead of building twice; the build goes to a temporary directory that is renamed into
//! place, so a killed build never leaves a half-written binary behind where the next run
//! would take it.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The reference's version, as `build-reference.sh` fetches it.
pub const VERSION: &str = "v1.7.0";

/// The variable naming a pre-built reference binary.
pub const BIN_ENV: &str = "DWD_REFERENCE_BIN";

/// Why the reference binary could not be found or built.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReferenceError {
    /// `DWD_REFERENCE_BIN` names no file.
    #[error("{BIN_ENV}={0} is not a file")]
    NotAFile(String),
    /// No cache directory could be chosen (no `HOME`).
    #[error(
        "no cache directory for the reference binary: set {BIN_ENV}, DWD_CONTROLPLANE_CACHE, XDG_CACHE_HOME or HOME"
    )]
    NoCacheDir,
    /// A file operation failed.
    #[error("{0}: {1}")]
    Io(String, String),
    /// The build script failed.
    #[error(
        "building the reference ({VERSION}) with {script} failed ({status}); it needs curl, unzip and Go, or set {BIN_ENV}"
    )]
    Build {
        /// The script run.
        script: String,
        /// Its exit status.
        status: String,
    },
}

/// The repository's `crates/dwd-bench/build-reference.sh`.
pub fn build_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../dwd-bench/build-reference.sh")
}

/// The directory the cached reference binary lives in (`<cache>/reference-v1.7.0`).
pub fn cache_dir() -> Result<PathBuf, ReferenceError> {
    let nonempty = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    let root = if let Some(dir) = nonempty("DWD_CONTROLPLANE_CACHE") {
        PathBuf::from(dir)
    } else if let Some(dir) = nonempty("XDG_CACHE_HOME") {
        PathBuf::from(dir).join("dependency-watchdog")
    } else if let Some(home) = nonempty("HOME") {
        PathBuf::from(home).join(".cache/dependency-watchdog")
    } else {
        return Err(ReferenceError::NoCacheDir);
    };
    Ok(root.join(format!("reference-{VERSION}")))
}

/// The reference binary: `DWD_REFERENCE_BIN`, else the cached one, else built into the cache
/// (once per machine; concurrent callers wait for one build). Answered once per process.
pub fn binary() -> Result<PathBuf, ReferenceError> {
    static BINARY: OnceLock<Result<PathBuf, ReferenceError>> = OnceLock::new();
    BINARY.get_or_init(locate).clone()
}

fn locate() -> Result<PathBuf, ReferenceError> {
    if let Some(bin) = std::env::var_os(BIN_ENV).filter(|v| !v.is_empty()) {
        let bin = PathBuf::from(bin);
        return if bin.is_file() {
            Ok(bin)
        } else {
            Err(ReferenceError::NotAFile(bin.display().to_string()))
        };
    }
    let dir = cache_dir()?;
    let bin = dir.join("dependency-watchdog");
    if bin.is_file() {
        return Ok(bin);
    }
    let parent = dir.parent().ok_or(ReferenceError::NoCacheDir)?;
    std::fs::create_dir_all(parent)
        .map_err(|e| ReferenceError::Io(format!("create {}", parent.display()), e.to_string()))?;
    let lock_path = parent.join(format!(".reference-{VERSION}.lock"));
    let lock = File::create(&lock_path)
        .map_err(|e| ReferenceError::Io(format!("open {}", lock_path.display()), e.to_string()))?;
    // Released when `lock` is dropped (or by the kernel when this process dies).
    lock.lock()
        .map_err(|e| ReferenceError::Io(format!("lock {}", lock_path.display()), e.to_string()))?;
    // Another process may have built it while we waited.
    if bin.is_file() {
        return Ok(bin);
    }
    build_into(&dir)?;
    drop(lock);
    Ok(bin)
}

/// Builds into `<dir>.partial.<pid>` and renames that to `dir`.
fn build_into(dir: &Path) -> Result<(), ReferenceError> {
    let partial = dir.with_file_name(format!(
        "{}.partial.{}",
        dir.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&partial);
    let script = build_script();
    eprintln!(
        "building the reference dependency-watchdog {VERSION} into {} (once per machine; a few minutes)",
        dir.display()
    );
    let started = std::time::Instant::now();
    // Everything the script prints goes to our stderr (the test's output), nothing is parsed.
    let status = Command::new("sh")
        .arg(&script)
        .arg(&partial)
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .map_err(|e| ReferenceError::Io(format!("run {}", script.display()), e.to_string()))?;
    if !status.success() || !partial.join("dependency-watchdog").is_file() {
        let _ = std::fs::remove_dir_all(&partial);
        return Err(ReferenceError::Build {
            script: script.display().to_string(),
            status: status.to_string(),
        });
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::rename(&partial, dir).map_err(|e| {
        ReferenceError::Io(
            format!("rename {} to {}", partial.display(), dir.display()),
            e.to_string(),
        )
    })?;
    eprintln!(
        "built the reference in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_script_is_the_benchmarks() {
        assert!(build_script().is_file(), "{}", build_script().display());
    }

    #[test]
    fn the_cache_is_keyed_by_version() {
        let dir = cache_dir();
        assert!(
            dir.as_ref()
                .is_ok_and(|d| d.ends_with(format!("reference-{VERSION}"))),
            "{dir:?}"
        );
    }
}
