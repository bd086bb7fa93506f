#!/usr/bin/env bash
# Builds the static (musl) release binary of `dependency-watchdog` for one architecture and
# prints its path on stdout (everything else goes to stderr).
#
#   image/binary.sh amd64|arm64
#
# The one recipe for the image's binary: image/build.sh (the offline OCI image) and the
# Dockerfile's build stage both call it, so both images carry the same binary.
#
# Installs what it lacks, only when it lacks it: the Rust target (rustup), a C compiler for the
# target (ring has C and assembly): `musl-gcc` (Debian's musl-tools) for the build machine's own
# architecture, Debian's cross gcc (`gcc-aarch64-linux-gnu` / `gcc-x86-64-linux-gnu`) for the
# other one, which also links. apt-get is used only as root.
#
# The target dir is target/image-build (DWD_IMAGE_TARGET_DIR overrides it; CARGO_TARGET_DIR
# does not): a dir of its own, so this release build never holds the lock of the target dir the
# tests use for minutes, and a CARGO_TARGET_DIR set for the tests (or inherited from `cargo
# test`) does not pull it there.
set -euo pipefail

arch="${1:-}"
case "$arch" in
  amd64) triple=x86_64-unknown-linux-musl gnu=x86_64-linux-gnu ;;
  arm64) triple=aarch64-unknown-linux-musl gnu=aarch64-linux-gnu ;;
  *)
    echo "usage: $0 amd64|arm64" >&2
    exit 2
    ;;
esac

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
export CARGO_TARGET_DIR="${DWD_IMAGE_TARGET_DIR:-$repo/target/image-build}"

log() { echo "image/binary.sh: $*" >&2; }

# Called from `cargo test` (tests/image.rs), the environment holds the variables cargo sets for
# the test process. Some build scripts (ring's) ask to rerun when CARGO_MANIFEST_DIR changes,
# so they would flip this build between "from the shell" and "from a test": minutes each time.
while IFS='=' read -r name _; do
  case "$name" in
    CARGO | CARGO_MANIFEST_* | CARGO_PKG_* | CARGO_CRATE_NAME | CARGO_BIN_* | \
      CARGO_PRIMARY_PACKAGE | CARGO_TARGET_TMPDIR | CARGO_RUSTC_CURRENT_DIR | OUT_DIR)
      unset "$name"
      ;;
  esac
done < <(env)

apt_install() {
  if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
    log "missing: $* (install it, or run as root on Debian/Ubuntu)"
    exit 1
  fi
  log "installing $*"
  if [[ -z "${DWD_APT_UPDATED:-}" ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    export DWD_APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
}

case "$(uname -m)" in
  x86_64) host=amd64 ;;
  aarch64 | arm64) host=arm64 ;;
  *) host=other ;;
esac

# The C compiler (and, across architectures, the linker) for the target.
triple_env="${triple//-/_}"
if [[ "$arch" == "$host" ]]; then
  command -v musl-gcc >/dev/null || apt_install musl-tools
  export "CC_${triple_env}=${CC_OVERRIDE:-musl-gcc}"
else
  cross_gcc="${gnu}-gcc"
  command -v "$cross_gcc" >/dev/null || apt_install "gcc-${gnu//_/-}"
  export "CC_${triple_env}=$cross_gcc"
  export "AR_${triple_env}=${gnu}-ar"
  linker_var="CARGO_TARGET_${triple_env^^}_LINKER"
  export "$linker_var=$cross_gcc"
fi

if command -v rustup >/dev/null; then
  rustup target list --installed 2>/dev/null | grep -qx "$triple" || {
    log "adding Rust target $triple"
    rustup target add "$triple" >&2
  }
fi

log "cargo build --release --target $triple (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
cargo build --release --locked --target "$triple" \
  -p dependency-watchdog --bin dependency-watchdog >&2

bin="$CARGO_TARGET_DIR/$triple/release/dependency-watchdog"
[[ -x "$bin" ]] || {
  log "no binary at $bin"
  exit 1
}
echo "$bin"
