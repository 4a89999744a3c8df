#!/usr/bin/env bash
# Make the local base images that the Dockerfile, compose and Ansible integration tests build on.
#
# Why: the CI/build machines reach no image registry (`docker pull` fails, the engine starts empty), but
# Debian mirrors and PyPI work. So the root image is made with debootstrap + `docker import`, and the rest
# are small `docker build`s on top of it (docker/base/*.Dockerfile, each taking ARG BASE_IMAGE).
#
# Images (all linux/amd64, Debian 12 bookworm):
#   ornith-local/debian:bookworm          minbase rootfs + ca-certificates (debootstrap, docker import)
#   ornith-local/python:3.11-bookworm     + python3 (3.11), venv, pip, curl; pip works as root
#                                         (PIP_BREAK_SYSTEM_PACKAGES=1). Stand-in base for the exporter,
#                                         cpu-demo and GPU engine Dockerfiles (no engine inside).
#   ornith-local/prometheus:bookworm      Debian's prometheus 2.42, user prometheus, ENTRYPOINT
#                                         /usr/bin/prometheus, layout like prom/prometheus (/prometheus).
#   ornith-local/systemd-host:bookworm    systemd as PID 1, python3, sudo, no GPU: a host for Ansible tests.
#
# Run the systemd host like this (measured on this machine: Docker 20.10.24, cgroup v1, fuse-overlayfs):
#   docker run -d --name HOST --hostname HOST --cgroupns=host \
#       -v /sys/fs/cgroup:/sys/fs/cgroup:rw --tmpfs /run --tmpfs /run/lock \
#       ornith-local/systemd-host:bookworm
#   docker exec HOST systemctl is-system-running --wait     # -> running, no failed units
# (for the first ~0.5 s after `docker run` that answers "Failed to connect to bus": retry until it says
# running; tests/integration/images.py has wait_for_systemd() and SYSTEMD_HOST_RUN_OPTIONS for this.)
# Each flag is needed here: without the two tmpfs systemd exits ("Failed to mount tmpfs at /run/lock:
# Operation not permitted", it lacks CAP_SYS_ADMIN to mount them itself); without the cgroup bind mount it
# exits too. --cgroupns=host is already Docker's default on cgroup v1 but is stated so the line means the
# same on a cgroup v2 daemon. Do NOT use --privileged (or --cap-add ALL) on this machine: the daemon itself
# lacks CAP_SYS_RESOURCE, so runc fails with "unable to apply caps: operation not permitted".
# Units started inside (systemctl enable --now ...) run and are reachable; `docker stop` takes < 1 s
# because the image's STOPSIGNAL is SIGRTMIN+3, systemd's clean-shutdown signal.
#
# Idempotent: an image whose tag exists with the same recipe hash (label org.ornith.base.recipe) is kept.
# Cache ($ORNITH_CACHE_DIR, default <repo>/.cache, git-ignored), so a second CI run with a fresh Docker
# daemon is fast:
#   base-images/debian-bookworm-amd64-<hash>.tar.gz   the debootstrapped rootfs (what `docker import` eats)
#   base-images/<name>-<hash>.tar                     `docker save` of each built image, reloaded when the
#                                                     tag is missing (no apt traffic on a warm cache)
# Usage: scripts/make-base-images.sh [--force] [--refresh] [--no-save] [--print-tags] [NAME...]
#   NAME in: debian python prometheus systemd-host (default: all; dependencies are made as needed)
#   --force      rebuild every image from its recipe (docker build --no-cache), even if the tag exists;
#                the cached rootfs is reused
#   --refresh    --force, and redo debootstrap too
#   --no-save    do not write `docker save` tarballs into the cache
#   --print-tags print "name=tag" lines for the selected images and exit
# Environment: ORNITH_CACHE_DIR, ORNITH_DEBIAN_MIRROR (default http://deb.debian.org/debian),
#   ORNITH_EXTRA_CA_DIR (default /usr/local/share/ca-certificates: the host CAs added as a top layer).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE_DIR="${ORNITH_CACHE_DIR:-$REPO_ROOT/.cache}/base-images"
MIRROR="${ORNITH_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
ARCH=amd64
DOCKERFILE_DIR="$REPO_ROOT/docker/base"
# Extra CA certificates the host trusts (a TLS-intercepting egress proxy's, a company CA). Containers need
# them too, or pip/curl to https:// fail inside them with "self-signed certificate in certificate chain".
# Set ORNITH_EXTRA_CA_DIR= (empty) to add none.
EXTRA_CA_DIR="${ORNITH_EXTRA_CA_DIR-/usr/local/share/ca-certificates}"
# Bump when the debootstrap recipe below changes in a way the hash cannot see.
RECIPE_VERSION=1

declare -A TAG=(
  [debian]=ornith-local/debian:bookworm
  [python]=ornith-local/python:3.11-bookworm
  [prometheus]=ornith-local/prometheus:bookworm
  [systemd-host]=ornith-local/systemd-host:bookworm
)
# Which local image each derived image is built FROM (passed as --build-arg BASE_IMAGE).
declare -A PARENT=([python]=debian [prometheus]=debian [systemd-host]=debian)
ORDER=(debian python prometheus systemd-host)

FORCE=0 REFRESH=0 SAVE=1 PRINT=0
WORK_DIR=""
trap 'if [[ -n $WORK_DIR ]]; then rm -rf "$WORK_DIR"; fi' EXIT
SELECTED=()

log() { printf '[make-base-images] %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 2; }

parse_args() {
  local arg
  for arg in "$@"; do
    case "$arg" in
      --force) FORCE=1 ;;
      --refresh) FORCE=1; REFRESH=1 ;;
      --no-save) SAVE=0 ;;
      --print-tags) PRINT=1 ;;
      -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
      -*) die "unknown option $arg (see --help)" ;;
      *) [[ -n "${TAG[$arg]:-}" ]] || die "unknown image '$arg'; choose from: ${ORDER[*]}"
         SELECTED+=("$arg") ;;
    esac
  done
  [[ ${#SELECTED[@]} -gt 0 ]] || SELECTED=("${ORDER[@]}")
}

# The recipe hash: anything that changes the image content changes the hash, so a stale tag or
# cached tarball is rebuilt rather than trusted. Derived images include their parent's hash.
declare -A HASH=()
recipe_hash() {
  local name=$1
  if [[ -n "${HASH[$name]:-}" ]]; then printf '%s' "${HASH[$name]}"; return; fi
  local h
  if [[ $name == rootfs ]]; then
    h=$( { echo "v$RECIPE_VERSION $SUITE $ARCH $MIRROR"; declare -f make_rootfs; } | sha256sum | cut -c1-12)
  elif [[ $name == debian ]]; then
    h=$( { recipe_hash rootfs; declare -f make_debian; } | sha256sum | cut -c1-12)
  else
    h=$( { recipe_hash "${PARENT[$name]}"; cat "$DOCKERFILE_DIR/$name.Dockerfile"; } | sha256sum | cut -c1-12)
  fi
  HASH[$name]=$h
  printf '%s' "$h"
}

image_hash() {  # prints the recipe label of a local image, or nothing when the tag is missing
  docker image inspect -f '{{ index .Config.Labels "org.ornith.base.recipe" }}' "$1" 2>/dev/null || true
}

need_debootstrap() {
  command -v debootstrap >/dev/null && return
  log "installing debootstrap with apt-get"
  [[ $(id -u) -eq 0 ]] || die "debootstrap is missing and installing it needs root: apt-get install debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends debootstrap >&2 \
    || { apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends debootstrap >&2; } \
    || die "could not install debootstrap with apt-get"
}

# debootstrap a minbase rootfs, make it container-friendly, and tar it up (numeric owners kept).
make_rootfs() {
  local out=$1 work rootfs
  [[ $(id -u) -eq 0 ]] || die "debootstrap needs root (it creates device nodes and chowns files)"
  need_debootstrap
  work=$(mktemp -d "$CACHE_DIR/.rootfs.XXXXXX")
  WORK_DIR=$work   # removed by the EXIT trap, also when debootstrap fails
  rootfs="$work/rootfs"
  log "debootstrap $SUITE ($ARCH, minbase) from $MIRROR"
  debootstrap --variant=minbase --arch="$ARCH" --include=ca-certificates \
    "$SUITE" "$rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1 \
    || { tail -n 20 "$work/debootstrap.log" >&2; die "debootstrap failed (log above)"; }
  # Sources like the official image: main, updates and security (deb822 format, as bookworm ships).
  rm -f "$rootfs/etc/apt/sources.list"
  cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  # Keep layers small: no .deb cache after installs, no translations (as the official image does).
  cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  echo 'Acquire::Languages "none";' >"$rootfs/etc/apt/apt.conf.d/docker-no-languages"
  echo 'Acquire::GzipIndexes "true";' >"$rootfs/etc/apt/apt.conf.d/docker-gzip-indexes"
  # Host-specific files debootstrap copied in; Docker provides its own at run time.
  : >"$rootfs/etc/resolv.conf"
  : >"$rootfs/etc/hostname"
  rm -f "$rootfs/etc/machine-id" "$rootfs/var/lib/dbus/machine-id"
  chroot "$rootfs" apt-get clean
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/log/*.log \
         "$rootfs"/var/cache/ldconfig/aux-cache "${rootfs:?}"/dev/* "$rootfs"/proc/* "$rootfs"/sys/* "$rootfs"/tmp/*
  log "packing rootfs into $out"
  tar --numeric-owner --xattrs -C "$rootfs" -czf "$out.partial" .
  find "$CACHE_DIR" -maxdepth 1 -name "debian-$SUITE-$ARCH-*.tar.gz" ! -name "${out##*/}" -delete
  mv "$out.partial" "$out"
  rm -rf "$work"
}

make_debian() {
  local hash tarball
  hash=$(recipe_hash debian)
  tarball="$CACHE_DIR/debian-$SUITE-$ARCH-$(recipe_hash rootfs).tar.gz"
  if [[ $REFRESH -eq 1 || ! -s $tarball ]]; then
    make_rootfs "$tarball"
  else
    log "using cached rootfs $tarball"
  fi
  log "docker import -> ${TAG[debian]}"
  docker import \
    --change "LABEL org.ornith.base.recipe=$hash" \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["bash"]' \
    "$tarball" "${TAG[debian]}" >/dev/null
}

make_derived() {
  local name=$1 hash saved
  hash=$(recipe_hash "$name")
  saved="$CACHE_DIR/$name-$hash.tar"
  if [[ $FORCE -eq 0 && -s $saved ]]; then
    log "docker load $saved"
    docker load -i "$saved" >/dev/null
    [[ $(image_hash "${TAG[$name]}") == "$hash" ]] && return
    log "cached tarball did not hold ${TAG[$name]} at $hash; building"
  fi
  log "docker build $name.Dockerfile -> ${TAG[$name]}"
  local no_cache=()
  [[ $FORCE -eq 1 ]] && no_cache=(--no-cache)
  docker build --quiet "${no_cache[@]}" \
    --build-arg "BASE_IMAGE=${RECIPE_ID[${PARENT[$name]}]}" \
    --label "org.ornith.base.recipe=$hash" \
    -f "$DOCKERFILE_DIR/$name.Dockerfile" -t "${TAG[$name]}" "$DOCKERFILE_DIR" >/dev/null
  if [[ $SAVE -eq 1 ]]; then
    rm -f "$CACHE_DIR/$name"-*.tar   # keep one tarball per image
    docker save -o "$saved.partial" "${TAG[$name]}" && mv "$saved.partial" "$saved"
  fi
}

# The host's extra CAs go into a thin top layer of each tag, never into the recipe images: the CA can change
# from one machine or session to the next, and the recipe images (and their cached tarballs) stay valid.
extra_ca_hash() {
  local certs=()
  [[ -n $EXTRA_CA_DIR && -d $EXTRA_CA_DIR ]] && mapfile -t certs < <(find "$EXTRA_CA_DIR" -maxdepth 1 -name '*.crt' -type f | sort)
  if [[ ${#certs[@]} -eq 0 ]]; then printf none; return; fi
  cat "${certs[@]}" | sha256sum | cut -c1-12
}

add_trust_layer() {
  local name=$1 want=$2 have ctx user
  have=$(docker image inspect -f '{{ index .Config.Labels "org.ornith.base.extra-ca" }}' "${TAG[$name]}")
  [[ $have == "$want" || ( -z $have && $want == none ) ]] && return
  if [[ $want == none ]]; then docker tag "${RECIPE_ID[$name]}" "${TAG[$name]}"; return; fi
  log "adding the host's CA certificates from $EXTRA_CA_DIR to ${TAG[$name]}"
  ctx=$(mktemp -d)
  find "$EXTRA_CA_DIR" -maxdepth 1 -name '*.crt' -type f -exec cp {} "$ctx/" \;
  # The layer is written as root; a non-root USER of the recipe image (prometheus) is restored after it.
  user=$(docker image inspect -f '{{.Config.User}}' "${RECIPE_ID[$name]}")
  docker build --quiet -f - -t "${TAG[$name]}" \
    --label "org.ornith.base.extra-ca=$want" --label "org.ornith.base.recipe-image=${RECIPE_ID[$name]}" \
    "$ctx" >/dev/null <<EOF
FROM ${RECIPE_ID[$name]}
USER root
COPY *.crt /usr/local/share/ca-certificates/
RUN update-ca-certificates >/dev/null
USER ${user:-root}
EOF
  rm -rf "$ctx"
}

# Make one image (after its parent), unless its tag already holds the current recipe.
declare -A MADE=() RECIPE_ID=()
ensure() {
  local name=$1 started old_id
  [[ -n "${MADE[$name]:-}" ]] && return
  [[ -n "${PARENT[$name]:-}" ]] && ensure "${PARENT[$name]}"
  started=$SECONDS
  old_id=$(docker image inspect -f '{{.Id}}' "${TAG[$name]}" 2>/dev/null || true)
  if [[ $FORCE -eq 0 && $(image_hash "${TAG[$name]}") == "$(recipe_hash "$name")" ]]; then
    log "${TAG[$name]} is up to date"
    RECIPE_ID[$name]=$(docker image inspect -f '{{ index .Config.Labels "org.ornith.base.recipe-image" }}' "${TAG[$name]}")
    [[ -n ${RECIPE_ID[$name]} ]] || RECIPE_ID[$name]=$old_id
  else
    if [[ $name == debian ]]; then make_debian; else make_derived "$name"; fi
    RECIPE_ID[$name]=$(docker image inspect -f '{{.Id}}' "${TAG[$name]}")
  fi
  add_trust_layer "$name" "$(extra_ca_hash)"
  if [[ $old_id != $(docker image inspect -f '{{.Id}}' "${TAG[$name]}") ]]; then
    # Drop the image the tag pointed to before, so rebuilds do not pile up dangling images; Docker
    # refuses while a container or a child image still uses it, which is fine.
    [[ -n $old_id ]] && { docker image rm "$old_id" >/dev/null 2>&1 || true; }
    log "${TAG[$name]} made in $((SECONDS - started)) s"
  fi
  MADE[$name]=1
}

main() {
  parse_args "$@"
  local name
  if [[ $PRINT -eq 1 ]]; then
    for name in "${SELECTED[@]}"; do printf '%s=%s\n' "$name" "${TAG[$name]}"; done
    return
  fi
  command -v docker >/dev/null || die "docker is not installed"
  docker info >/dev/null 2>&1 || die "cannot reach the Docker daemon (is it running, may this user use it?)"
  mkdir -p "$CACHE_DIR"
  # Several test sessions may call this at once (pytest fixtures, engineers, CI): one at a time, or two
  # runs would race on the same tags and cache files.
  exec 9>"$CACHE_DIR/.lock"
  if ! flock --nonblock 9; then
    log "another make-base-images run holds $CACHE_DIR/.lock; waiting for it"
    flock 9
  fi
  for name in "${SELECTED[@]}"; do ensure "$name"; done
  for name in "${SELECTED[@]}"; do printf '%s=%s\n' "$name" "${TAG[$name]}"; done
}

main "$@"
