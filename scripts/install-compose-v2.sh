#!/usr/bin/env bash
# Install Compose v2 (`docker compose`, the Go CLI) as Docker's CLI plugin from Debian trixie's
# docker-compose package, on a bookworm host whose own archive has only docker-compose v1.
# The package depends only on libc6 (>= 2.34); it is fetched with apt from the trixie suite in an apt
# state of its own (sources, lists and archives under CACHE_DIR), so the host's apt sources and package
# database are not touched, and the binary is unpacked with dpkg-deb -x into the plugin directory.
#
#   scripts/install-compose-v2.sh [CACHE_DIR]   (default: $ORNITH_CACHE_DIR/compose-v2; needs root)
set -euo pipefail

PLUGIN=/usr/libexec/docker/cli-plugins/docker-compose
cache="${1:-${ORNITH_CACHE_DIR:-$PWD/.cache}/compose-v2}"

if docker compose version >/dev/null 2>&1; then
  docker compose version
  exit 0
fi
mkdir -p "$cache/lists/partial" "$cache/archives/partial"
deb=$(find "$cache/archives" -maxdepth 1 -name 'docker-compose_2.*.deb' | sort -V | tail -n 1)
if [[ -z $deb ]]; then
  echo 'deb http://deb.debian.org/debian trixie main' >"$cache/trixie.list"
  apt_trixie=(apt-get -qq -o Dir::Etc::sourcelist="$cache/trixie.list" -o Dir::Etc::sourceparts=-
              -o Dir::State::Lists="$cache/lists" -o Dir::Cache::archives="$cache/archives"
              -o APT::Get::List-Cleanup=0)
  "${apt_trixie[@]}" update
  (cd "$cache/archives" && "${apt_trixie[@]}" download docker-compose)
  deb=$(find "$cache/archives" -maxdepth 1 -name 'docker-compose_2.*.deb' | sort -V | tail -n 1)
  [[ -n $deb ]] || { echo "error: trixie's docker-compose is not version 2" >&2; exit 1; }
fi
unpacked=$(mktemp -d)
trap 'rm -rf "$unpacked"' EXIT
dpkg-deb -x "$deb" "$unpacked"
binary=$(find "$unpacked" -type f -name docker-compose -perm -u+x | head -n 1)
[[ -n $binary ]] || { echo "error: $deb holds no docker-compose binary" >&2; exit 1; }
install -D -m 0755 "$binary" "$PLUGIN"
docker compose version
