//! Building a workspace binary from inside a test or a tool, the way `cargo build` from a shell
//! would: the sandbox and the parity runner need the `dependency-watchdog` executable, and the
//! path cargo reports is the only reliable one (the target dir is the environment's choice).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::TestEnvError;

/// Runs `cargo build -p PACKAGE --bin BIN [--release]` in `workspace_root` and returns the
/// executable cargo reports. Diagnostics go to our stderr.
///
/// Inside `cargo test` the environment carries the test crate's `CARGO_PKG_*`,
/// `CARGO_MANIFEST_*`, `OUT_DIR`…; build scripts (ring's) rerun when those change, so a nested
/// build with them rebuilt ring, rustls and kube (~75 s here) on every test run, and the next
/// ordinary build rebuilt them back. Those variables are removed; cargo's own configuration
/// (`CARGO_HOME`, `CARGO_TARGET_DIR`, `CARGO_BUILD_*`, …) stays.
pub fn build_bin(
    workspace_root: &Path,
    package: &str,
    bin: &str,
    release: bool,
) -> Result<PathBuf, TestEnvError> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut args = vec![
        "build",
        "-p",
        package,
        "--bin",
        bin,
        "--message-format=json-render-diagnostics",
    ];
    if release {
        args.push("--release");
    }
    let what = format!("cargo {}", args.join(" "));
    let mut command = Command::new(&cargo);
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        if is_cargo_set_for_crates(key) {
            command.env_remove(key);
        }
    }
    let output = command
        .args(&args)
        .current_dir(workspace_root)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| TestEnvError::Io(format!("run {what}"), e))?;
    if !output.status.success() {
        return Err(TestEnvError::Spawn(
            what,
            format!("cargo exited with {}", output.status),
        ));
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == bin)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| TestEnvError::Spawn(what, format!("cargo reported no {bin} executable")))
}

/// Whether `key` is one of the variables cargo sets for a crate being built or tested (as
/// opposed to cargo's own configuration).
fn is_cargo_set_for_crates(key: &str) -> bool {
    const CONFIG: [&str; 12] = [
        "CARGO_HOME",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_",
        "CARGO_PROFILE_",
        "CARGO_REGISTRIES_",
        "CARGO_REGISTRY_",
        "CARGO_NET_",
        "CARGO_HTTP_",
        "CARGO_TERM_",
        "CARGO_INCREMENTAL",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_UNSTABLE_",
    ];
    key == "OUT_DIR" || (key.starts_with("CARGO_") && !CONFIG.iter().any(|c| key.starts_with(c)))
}

#[cfg(test)]
mod tests {
    use super::is_cargo_set_for_crates;

    #[test]
    fn a_crates_build_variables_are_dropped_cargos_configuration_kept() {
        for key in [
            "CARGO_PKG_NAME",
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_LINKS",
            "OUT_DIR",
        ] {
            assert!(is_cargo_set_for_crates(key), "{key}");
        }
        for key in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_JOBS",
            "PATH",
        ] {
            assert!(!is_cargo_set_for_crates(key), "{key}");
        }
    }
}
