#!/usr/bin/env bash
# Build, on a machine with PyPI, the payload tests/gpu/run_sglang_h200.sh installs on the H200 machines.
#
#   bash tests/gpu/make_sglang_payload.sh     # writes .gpu/sglang/xfer1 .. xferN (ignored folder)
#
# - the wheels of tests/gpu/sglang-wheels.txt (sglang 0.5.17 cp312 and the set it served with on the
#   H200 at tp 1 and tp 2), installed here with `pip install --no-deps --target` for CPython 3.12 on x86_64;
# - sglang-kernel 0.4.5 (383 MB) unpacked without `sgl_kernel/flash_ops.abi3.so` (1.12 GB of
#   FlashAttention-3 kernels: the run uses the triton attention backend, as an A100 would),
#   `sgl_kernel/sm100/common_ops.abi3.so` (Blackwell) and `sgl_kernel/infllm_ops*.so` (never loaded);
# - torch is not carried: the machine's own torch 2.11.0+cu130 is the one sglang 0.5.17 pins.
# - math-verify and its two dependencies as wheels in the last folder (the ornith-stack CLI imports it;
#   run_sglang_h200.sh unpacks a staged folder's wheels into $W/wheels).
# Packed as one tar.xz split into parts of PART_MIB (38 MiB), one per folder xferN, so that each device
# call (64 MiB at most, the working tree of about 19 MiB included) carries one folder; xfer<last> holds
# the manifest.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
G=$REPO/.gpu/sglang
PART_MIB=${PART_MIB:-38}
PY=${PYTHON:-python3}
PLAT=()
for p in manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 \
    manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 linux_x86_64; do
    PLAT+=(--platform "$p")
done
PIPX=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}")
mkdir -p "$G/dl" "$G/deps"
cd "$G"

"$PY" -m pip download -q "${PIPX[@]}" -d deps -r "$REPO/tests/gpu/sglang-wheels.txt"
"$PY" -m pip download -q "${PIPX[@]}" -d dl sglang-kernel==0.4.5

rm -rf site && mkdir site
"$PY" -m pip install -q --no-compile --ignore-requires-python --target site "${PIPX[@]}" deps/*.whl
(cd site && unzip -q -o ../dl/sglang_kernel-0.4.5-*.whl \
    && rm -f sgl_kernel/flash_ops.abi3.so sgl_kernel/sm100/common_ops.abi3.so sgl_kernel/infllm_ops*.so)
rm -rf site/bin site/mistral_common/data/* site/pycountry/locales/*
echo "sglang 0.5.17 payload, $(date -u +%Y-%m-%dT%H:%MZ)" > site/.sglang-payload
du -sh site

tar -C site -cf - . | xz -6 -T2 > sglang.tar.xz
rm -rf xfer* parts && mkdir parts
split -b "${PART_MIB}M" -a 2 sglang.tar.xz parts/sglang.tar.xz.part-
(cd parts && sha256sum sglang.tar.xz.part-*) > manifest.sha256
i=0
for part in parts/*; do
    i=$((i + 1)); mkdir "xfer$i"; mv "$part" "xfer$i/"
done
cp manifest.sha256 "xfer$i/"
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "xfer$i" \
    math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
rmdir parts
du -sh sglang.tar.xz xfer*
