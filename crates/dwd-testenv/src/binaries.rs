//! Finding (and, once per machine, building) the real control-plane binaries.
//!
//! `testenv/build.sh` owns the build: the pinned Go module, the version-keyed cache outside
//! the repository, the file lock against concurrent builds, and the
//! `DWD_CONTROLPLANE_BIN_DIR` override for pre-built binaries. This module only runs it
//! once per process and remembers the answer.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::TestEnvError;

/// Paths of the control-plane binaries.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// kube-apiserver, built from k8s.io/kubernetes at the pinned release.
    pub kube_apiserver: PathBuf,
    /// etcd, built from go.etcd.io/etcd/server/v3 at the version Kubernetes pins.
    pub etcd: PathBuf,
}

/// The repository's `testenv/build.sh`.
pub fn build_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testenv/build.sh")
}

/// Locates the binaries, building them on first use (minutes, once per machine).
pub fn binaries() -> Result<Binaries, TestEnvError> {
    static BINARIES: OnceLock<Result<Binaries, String>> = OnceLock::new();
    BINARIES
        .get_or_init(|| locate().map_err(|e| e.to_string()))
        .clone()
        .map_err(TestEnvError::Binaries)
}

fn locate() -> Result<Binaries, TestEnvError> {
    let script = build_script();
    let output = Command::new("bash")
        .arg(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| TestEnvError::Io(format!("run {}", script.display()), e))?;
    if !output.status.success() {
        return Err(TestEnvError::Binaries(format!(
            "{} failed with {}",
            script.display(),
            output.status
        )));
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    let bins = Binaries {
        kube_apiserver: dir.join("kube-apiserver"),
        etcd: dir.join("etcd"),
    };
    for bin in [&bins.kube_apiserver, &bins.etcd] {
        if !bin.is_file() {
            return Err(TestEnvError::Binaries(format!(
                "{} is missing",
                bin.display()
            )));
        }
    }
    Ok(bins)
}
