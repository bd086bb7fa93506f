#!/usr/bin/env bash
# Builds the real control-plane binaries (kube-apiserver, etcd) from the pinned Go
# module in controlplane/ and prints the directory that holds them.
#
# - Cached outside the repository, keyed by version:
#     ${DWD_CONTROLPLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dependency-watchdog}/controlplane-<versions>/
# - A file lock (flock) makes concurrent callers wait instead of building twice.
# - DWD_CONTROLPLANE_BIN_DIR, if set, names a directory with pre-built binaries;
#   nothing is built then.
# All diagnostics go to stderr; stdout carries only the directory.
set -euo pipefail

if [[ -n "${DWD_CONTROLPLANE_BIN_DIR:-}" ]]; then
  for b in kube-apiserver etcd; do
    [[ -x "$DWD_CONTROLPLANE_BIN_DIR/$b" ]] || { echo "DWD_CONTROLPLANE_BIN_DIR=$DWD_CONTROLPLANE_BIN_DIR has no executable $b" >&2; exit 1; }
  done
  echo "$DWD_CONTROLPLANE_BIN_DIR"
  exit 0
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mod="$here/controlplane"
k8s_version="$(awk '$1=="k8s.io/kubernetes"{print $2; exit}' "$mod/go.mod")"
etcd_version="$(awk '$1=="go.etcd.io/etcd/server/v3"{print $2; exit}' "$mod/go.mod")"
[[ -n "$k8s_version" && -n "$etcd_version" ]] || { echo "cannot read versions from $mod/go.mod" >&2; exit 1; }

cache_root="${DWD_CONTROLPLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dependency-watchdog}"
out="$cache_root/controlplane-k8s-$k8s_version-etcd-$etcd_version"
mkdir -p "$cache_root"

exec 9>"$cache_root/.build.lock"
flock 9

if [[ -x "$out/kube-apiserver" && -x "$out/etcd" ]]; then
  echo "$out"
  exit 0
fi

command -v go >/dev/null || { echo "go is not installed; it is needed once to build kube-apiserver and etcd" >&2; exit 1; }

tmp="$out.partial.$$"
rm -rf "$tmp"; mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT

major="${k8s_version#v}"; major="${major%%.*}"
minor="${k8s_version#v*.}"; minor="${minor%%.*}"
build_date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
vpkg=k8s.io/component-base/version
ldflags="-s -w -X $vpkg.gitVersion=$k8s_version -X $vpkg.gitMajor=$major -X $vpkg.gitMinor=$minor -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=$build_date"

echo "building kube-apiserver $k8s_version and etcd $etcd_version into $out (once; takes a few minutes)" >&2
start=$SECONDS
cd "$mod"
export CGO_ENABLED=0 GOFLAGS=-mod=readonly
# -p 2: this machine has 2 cores; more parallel links only add memory pressure.
go build -p 2 -trimpath -ldflags "$ldflags" -o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
go build -p 2 -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
echo "built in $((SECONDS - start))s" >&2

rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "$out"
