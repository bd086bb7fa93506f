#!/usr/bin/env bash
# Builds the dependency-watchdog container image offline, without a container engine or a
# registry, as an OCI image layout (a directory skopeo, crane, containerd or podman can read).
#
#   image/build.sh [--arch amd64|arm64|all] [--out DIR] [--tag TAG]
#
#   --arch  platforms to build (default: all = linux/amd64 and linux/arm64)
#   --out   the OCI layout to write (default: target/image/oci); replaced as a whole
#   --tag   its tag (default: the workspace version, e.g. 0.1.0)
#
# The layout holds, under TAG, an image index with one manifest per platform, and each
# platform's manifest under TAG-ARCH too. One layer per platform: the image of the Dockerfile
# beside it (a distroless static `nonroot` image plus the binary), assembled by hand:
#
#   /usr/local/bin/dependency-watchdog   the static musl release binary (image/binary.sh), 0755
#   /etc/ssl/certs/ca-certificates.crt   Debian's CA bundle
#   /etc/passwd, /etc/group              root, nobody and nonroot (65532), as distroless has them
#   /home/nonroot                        nonroot's home (65532:65532, 0700), the working dir
#   /tmp                                 1777
#
# Config: User 65532:65532, Entrypoint ["/usr/local/bin/dependency-watchdog"], WorkingDir
# /home/nonroot, Env PATH and SSL_CERT_FILE (as distroless), OCI labels (source, version,
# revision, created, ...). Timestamps come from the commit (or SOURCE_DATE_EPOCH), so the same
# commit gives the same layers and configs.
#
# Idempotent: installs only what is missing (umoci, jq, Debian's CA bundle; rustup targets and
# C compilers via image/binary.sh), rebuilds the binaries incrementally, and rewrites the layout
# only when an input changed. Concurrent runs wait for each other (a lock beside --out).
#
# Push (from any machine with skopeo; --all keeps every platform of the index):
#   skopeo copy --all oci:target/image/oci:0.1.0 docker://REGISTRY/REPOSITORY:0.1.0
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

arch_arg=all
out="target/image/oci"
tag=""
while (($#)); do
  case "$1" in
    --arch) arch_arg="${2:?--arch needs a value}"; shift 2 ;;
    --arch=*) arch_arg="${1#*=}"; shift ;;
    --out) out="${2:?--out needs a value}"; shift 2 ;;
    --out=*) out="${1#*=}"; shift ;;
    --tag) tag="${2:?--tag needs a value}"; shift 2 ;;
    --tag=*) tag="${1#*=}"; shift ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "unknown argument: $1 (see --help)" >&2
      exit 2
      ;;
  esac
done
case "$arch_arg" in
  all) arches=(amd64 arm64) ;;
  amd64 | arm64) arches=("$arch_arg") ;;
  *)
    echo "--arch must be amd64, arm64 or all" >&2
    exit 2
    ;;
esac

log() { echo "image/build.sh: $*" >&2; }

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

# --- tools ----------------------------------------------------------------------------------
ca_bundle=/etc/ssl/certs/ca-certificates.crt
need=()
command -v umoci >/dev/null || need+=(umoci)
command -v jq >/dev/null || need+=(jq)
command -v flock >/dev/null || need+=(util-linux)
command -v sha256sum >/dev/null || need+=(coreutils)
command -v gzip >/dev/null || need+=(gzip)
[[ -s "$ca_bundle" ]] || need+=(ca-certificates)
if ((${#need[@]})); then
  apt_install "${need[@]}"
fi
[[ -s "$ca_bundle" ]] || {
  log "no CA bundle at $ca_bundle"
  exit 1
}

# --- the one-at-a-time lock -----------------------------------------------------------------
mkdir -p "$(dirname "$out")"
out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
exec 9>"$out.lock"
flock 9

# --- metadata -------------------------------------------------------------------------------
version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)"
[[ -n "$version" ]] || {
  log "no workspace version in Cargo.toml"
  exit 1
}
tag="${tag:-$version}"
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
if [[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
  revision="$revision-dirty"
fi
epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
created="$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)"
# org.opencontainers.image.source: DWD_IMAGE_SOURCE, else the `origin` remote when it is a web
# address; left out otherwise.
source_url="${DWD_IMAGE_SOURCE:-$(git remote get-url origin 2>/dev/null || true)}"
[[ "$source_url" == https://* ]] || source_url="${DWD_IMAGE_SOURCE:-}"

# --- binaries -------------------------------------------------------------------------------
declare -A bins
for arch in "${arches[@]}"; do
  start=$SECONDS
  bins[$arch]="$(bash image/binary.sh "$arch")"
  log "$arch binary: ${bins[$arch]} ($((SECONDS - start)) s)"
done

# --- up to date? ----------------------------------------------------------------------------
# The stamp beside the layout: a hash of the common inputs, then one line per platform with its
# binary's hash. A layout holding more platforms than asked for, all current, is up to date.
stamp="$out.inputs"
want_stamp="$(
  echo "common $({
    echo "tag=$tag version=$version revision=$revision created=$created source=$source_url"
    sha256sum "$ca_bundle" "${BASH_SOURCE[0]}" | cut -d' ' -f1
  } | sha256sum | cut -d' ' -f1)"
  for arch in "${arches[@]}"; do
    echo "$arch $(sha256sum "${bins[$arch]}" | cut -d' ' -f1)"
  done
)"

# Sizes of each platform's image: its layer as stored and pushed (gzip), and the bytes of the
# files it unpacks to.
report() {
  local layout="$1" top arch manifest layer layer_bytes unpacked
  top="$(jq -r --arg t "$tag" \
    '.manifests[] | select(.annotations["org.opencontainers.image.ref.name"] == $t) | .digest' \
    "$layout/index.json")"
  echo "OCI layout: $layout, tag $tag: image index $top"
  while read -r arch manifest; do
    layer="$(jq -r '.layers[0].digest' "$layout/blobs/sha256/${manifest#sha256:}")"
    layer_bytes="$(stat -c %s "$layout/blobs/sha256/${layer#sha256:}")"
    unpacked="$(gzip -dc "$layout/blobs/sha256/${layer#sha256:}" | tar -tv --numeric-owner |
      awk '{ s += $3 } END { print s }')"
    awk -v a="$arch" -v m="$manifest" -v l="$layer_bytes" -v u="$unpacked" 'BEGIN {
      printf "linux/%s: manifest %s, layer %d bytes compressed (%.2f MiB), files %d bytes unpacked (%.2f MiB)\n",
        a, m, l, l / 1048576, u, u / 1048576 }'
  done < <(jq -r '.manifests[] | "\(.platform.architecture) \(.digest)"' \
    "$layout/blobs/sha256/${top#sha256:}")
  echo "push: skopeo copy --all oci:$layout:$tag docker://REGISTRY/REPOSITORY:$tag"
}

if [[ -f "$stamp" && -f "$out/index.json" ]] &&
  [[ -z "$(comm -13 <(sort "$stamp") <(sort <<<"$want_stamp"))" ]]; then
  log "up to date: $out"
  report "$out"
  exit 0
fi

# --- assemble -------------------------------------------------------------------------------
work="$(mktemp -d "$out.work.XXXXXX")"
trap 'rm -rf "$work"' EXIT
layout="$work/oci"
umoci init --layout "$layout"

image_labels=(
  "org.opencontainers.image.title=dependency-watchdog"
  "org.opencontainers.image.description=Gardener dependency-watchdog in Rust: prober (meltdown protection) and weeder (crash-loop recovery)"
  "org.opencontainers.image.version=$version"
  "org.opencontainers.image.revision=$revision"
  "org.opencontainers.image.created=$created"
  "org.opencontainers.image.licenses=Apache-2.0"
)
[[ -n "$source_url" ]] && image_labels+=("org.opencontainers.image.source=$source_url")

# Deterministic tar: sorted names, the commit's mtime, numeric owners, no atime/ctime.
tar_opts=(--format=posix "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime"
  --sort=name --mtime="@$epoch" --numeric-owner)

for arch in "${arches[@]}"; do
  rootfs="$work/rootfs-$arch"
  mkdir -p "$rootfs"/{etc/ssl/certs,home/nonroot,tmp,usr/local/bin}
  install -m 0755 "${bins[$arch]}" "$rootfs/usr/local/bin/dependency-watchdog"
  install -m 0644 "$ca_bundle" "$rootfs/etc/ssl/certs/ca-certificates.crt"
  # distroless's /etc/passwd and /etc/group (base-debian12 / static-debian12).
  printf '%s\n' \
    'root:x:0:0:root:/root:/sbin/nologin' \
    'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
    'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$rootfs/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'tty:x:5:' 'staff:x:50:' 'nonroot:x:65532:' \
    >"$rootfs/etc/group"
  chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group"
  find "$rootfs" -type d -exec chmod 0755 {} +
  chmod 0700 "$rootfs/home/nonroot"
  chmod 1777 "$rootfs/tmp"

  # Root owns everything but nonroot's home (appended with its owner): no root needed here.
  layer="$work/layer-$arch.tar"
  tar -C "$rootfs" "${tar_opts[@]}" --owner=0 --group=0 --exclude=./home/nonroot -cf "$layer" .
  tar -C "$rootfs" "${tar_opts[@]}" --owner=65532 --group=65532 -rf "$layer" ./home/nonroot

  ref="$layout:$tag-$arch"
  umoci new --image "$ref"
  umoci raw add-layer --image "$ref" --history.created "$created" \
    --history.created_by "image/build.sh: distroless-like root filesystem + dependency-watchdog" \
    "$layer"
  config_args=(
    --os linux --architecture "$arch" --created "$created" --no-history
    --config.user 65532:65532
    --config.entrypoint /usr/local/bin/dependency-watchdog
    --config.workingdir /home/nonroot
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    --config.env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
  )
  for label in "${image_labels[@]}"; do
    config_args+=(--config.label "$label" --manifest.annotation "$label")
  done
  umoci config --image "$ref" "${config_args[@]}"
done
umoci gc --layout "$layout"

# The multi-platform image index under TAG (umoci writes one manifest per tag).
entries="[]"
for arch in "${arches[@]}"; do
  entry="$(jq -c --arg t "$tag-$arch" --arg a "$arch" '
    .manifests[] | select(.annotations["org.opencontainers.image.ref.name"] == $t)
    | {mediaType, digest, size, platform: ({os: "linux", architecture: $a}
        + (if $a == "arm64" then {variant: "v8"} else {} end))}' "$layout/index.json")"
  entries="$(jq -c --argjson e "$entry" '. + [$e]' <<<"$entries")"
done
annotations="$(printf '%s\n' "${image_labels[@]}" | jq -R 'split("=") | {(.[0]): (.[1:] | join("="))}' | jq -s add)"
jq -n --argjson m "$entries" --argjson a "$annotations" \
  '{schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json", manifests: $m, annotations: $a}' \
  >"$work/index-blob.json"
index_digest="$(sha256sum "$work/index-blob.json" | cut -d' ' -f1)"
index_size="$(stat -c %s "$work/index-blob.json")"
cp "$work/index-blob.json" "$layout/blobs/sha256/$index_digest"
jq --arg d "sha256:$index_digest" --argjson s "$index_size" --arg t "$tag" '
  .manifests += [{mediaType: "application/vnd.oci.image.index.v1+json", digest: $d, size: $s,
                  annotations: {"org.opencontainers.image.ref.name": $t}}]' \
  "$layout/index.json" >"$work/index.json"
mv "$work/index.json" "$layout/index.json"

chmod -R a+rX "$layout"
rm -rf "$out" "$stamp"
mv "$layout" "$out"
echo "$want_stamp" >"$stamp"
log "wrote $out"
report "$out"
