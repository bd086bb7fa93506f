#!/bin/sh
# Builds the reference dependency-watchdog (gardener/dependency-watchdog v1.7.0) for the
# benchmark's compare mode, without `go install`:
#
#   crates/dwd-bench/build-reference.sh [OUT_DIR]      # default OUT_DIR: $HOME/dwd-ref
#
# `go install …@v1.7.0` needs the module proxy's version list (`@v/list`), which some proxies
# and mirrors refuse (403) while still serving the module zip; this fetches the zip directly and
# builds it in a temporary directory. Needs curl, unzip and Go >= the module's `go` line.
# Never commit the binary it produces.
#
# DWD_REF_VERSION overrides the version, DWD_REF_PROXY the proxy (default proxy.golang.org).
set -eu

version="${DWD_REF_VERSION:-v1.7.0}"
proxy="${DWD_REF_PROXY:-https://proxy.golang.org}"
out="${1:-$HOME/dwd-ref}"
module="github.com/gardener/dependency-watchdog"

for tool in curl unzip go; do
  command -v "$tool" >/dev/null 2>&1 || { echo "build-reference.sh: $tool not found" >&2; exit 1; }
done

tmp="$(mktemp -d)"
# The module cache layout is read-only; make it writable so the cleanup can remove it.
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT INT TERM

echo "fetching $module@$version from $proxy" >&2
curl -fsSL "$proxy/$module/@v/$version.zip" -o "$tmp/module.zip"
unzip -q "$tmp/module.zip" -d "$tmp/src"
src="$tmp/src/$module@$version"
chmod -R u+w "$src"

mkdir -p "$out"
out="$(cd "$out" && pwd)"
echo "building $out/dependency-watchdog (a few minutes the first time)" >&2
# Static binary; -mod=mod lets go resolve the module's dependencies from go.sum through the
# proxy even though the zip has no vendor directory.
(cd "$src" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -o "$out/dependency-watchdog" .)
echo "$out/dependency-watchdog" >&2
"$out/dependency-watchdog" 2>&1 | grep -q prober || { echo "build-reference.sh: built binary does not look like dependency-watchdog" >&2; exit 1; }
echo "ok: run bench with --compare-bin $out/dependency-watchdog" >&2
