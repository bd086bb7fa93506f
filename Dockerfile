# syntax=docker/dockerfile:1
#
# The dependency-watchdog container image, for linux/amd64 and linux/arm64:
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg VERSION=0.1.0 --build-arg REVISION="$(git rev-parse HEAD)" \
#     -t REGISTRY/REPOSITORY:0.1.0 --push .
#
# Kept in step with image/build.sh, which assembles the same image offline (no container engine
# or registry) as an OCI layout, and which tests/image.rs runs: the same binary (both build it
# with image/binary.sh: static musl, release profile, cross-compiled on the build platform), at
# the same path, /usr/local/bin/dependency-watchdog; the same user, 65532:65532 (distroless's
# `nonroot`); the same entrypoint, working dir and environment; Debian 12's CA bundle. Gardener
# runs `/usr/local/bin/dependency-watchdog prober|weeder ...`: the path is part of the contract.

ARG RUST_VERSION=1.95

FROM --platform=$BUILDPLATFORM rust:${RUST_VERSION}-bookworm AS build
ARG TARGETARCH
WORKDIR /src
COPY . .
# image/binary.sh installs the target's C compiler (musl-gcc, or Debian's cross gcc for the other
# architecture) and Rust target, then builds. The caches keep crates and artifacts across builds.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target/image-build \
    cp "$(bash image/binary.sh "$TARGETARCH")" /dependency-watchdog

# Debian 12 distroless, static variant, `nonroot` (uid/gid 65532, home /home/nonroot): CA
# certificates, /etc/passwd and /etc/group, /tmp, tzdata; no shell, no libc.
FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=""
LABEL org.opencontainers.image.title="dependency-watchdog" \
      org.opencontainers.image.description="Gardener dependency-watchdog in Rust: prober (meltdown protection) and weeder (crash-loop recovery)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="${SOURCE}"
COPY --from=build --chmod=0755 /dependency-watchdog /usr/local/bin/dependency-watchdog
USER 65532:65532
WORKDIR /home/nonroot
ENTRYPOINT ["/usr/local/bin/dependency-watchdog"]
