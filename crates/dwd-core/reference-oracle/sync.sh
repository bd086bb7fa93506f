#!/bin/sh
# Copies the reference's config code (dependency-watchdog v1.7.0) verbatim into ./ref, rewriting
# only the module path of its imports, so the oracle runs the reference's own loaders.
# Usage: ./sync.sh [path to a git mirror of gardener/dependency-watchdog]
set -eu
repo=${1:-/work/.mirror/gardener+dependency-watchdog/repo}
tag=v1.7.0
cd "$(dirname "$0")"
for f in api/prober/types.go api/weeder/types.go internal/prober/config.go \
         internal/weeder/config.go internal/util/validator.go internal/util/util.go; do
    # Go forbids importing "internal" packages from outside their parent, so internal/ becomes
    # intern/ here (path and imports alike).
    out="ref/$(echo "$f" | sed 's#^internal/#intern/#')"
    mkdir -p "$(dirname "$out")"
    git -C "$repo" show "$tag:$f" |
        sed -e 's#github.com/gardener/dependency-watchdog/internal/#dwd-reference-oracle/ref/intern/#' \
            -e 's#github.com/gardener/dependency-watchdog/#dwd-reference-oracle/ref/#' >"$out"
done
