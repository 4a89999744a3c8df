#!/usr/bin/env bash
# Build, on a machine with PyPI, the payload tests/gpu/run_vllm_h200.sh installs on the H200 machine.
#
#   bash tests/gpu/make_payload.sh            # writes .gpu/xfer1 .gpu/xfer2 .gpu/xfer3 (ignored folder)
#
# - vllm==0.24.0 (cp38-abi3 manylinux_2_28 x86_64, 279 MB) unpacked and stripped of what an H200 run
#   does not load: the FA2 build (Hopper uses FA3), the vllm-rs binary, the sm100 FMHA and DeepGEMM
#   CUDA headers, and the DeepGEMM builds for other Pythons (none of them loaded on the H200); packed as tar.xz
#   and split in three.
# - the dependency wheels the machine lacks (KINDS.md lists what it has; payload-wheels.txt, resolved by
#   payload_deps.py), installed here with `pip install --no-deps --target` for CPython 3.12, trimmed
#   (mistral_common's Mistral tokenizer data, pycountry's translations) and packed as one tar.xz. Left out on purpose:
#   flashinfer, tilelang, cutlass-dsl, quack, tokenspeed-mla, humming-kernels, fastsafetensors,
#   cudnn-frontend (hence VLLM_USE_FLASHINFER_SAMPLER=0 and gdn_prefill_backend=triton), and the
#   fastapi-cloud-cli / cryptography chain nothing in the server imports.
# Each xferN stays under 64 MiB, the most one device call carries (with the working tree).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
G=$REPO/.gpu
PY=${PYTHON:-python3}
mkdir -p "$G/dl"
cd "$G"

"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d dl vllm==0.24.0
rm -rf site_vllm && mkdir site_vllm
(cd site_vllm && unzip -q ../dl/vllm-0.24.0-*.whl \
    && rm -f vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so vllm/vllm-rs \
    && rm -rf vllm/third_party/fmha_sm100 vllm/third_party/deep_gemm/include \
    && rm -f vllm/third_party/deep_gemm/_C.cpython-31[0134]-*.so)
tar -C site_vllm -cf - . | xz -9e -T2 > vllm.tar.xz

# The dependency wheels: exactly tests/gpu/payload-wheels.txt. To re-resolve it (newer releases), run
#   (cd .gpu && python3 ../tests/gpu/payload_deps.py deps <vLLM's Requires-Dist without extras>)
# with .gpu/device_pkgs.txt holding KINDS.md's package list, and write the result back to the file.
rm -rf deps && mkdir deps
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d deps -r "$REPO/tests/gpu/payload-wheels.txt"
rm -rf site_deps
"$PY" -m pip install -q --no-deps --no-compile --target site_deps --python-version 3.12 --implementation cp \
    --only-binary=:all: --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 deps/*.whl
rm -rf site_deps/mistral_common/data/* site_deps/pycountry/locales/*
tar -C site_deps -cf - . | xz -9e -T2 > deps.tar.xz

rm -rf xfer1 xfer2 xfer3 && mkdir xfer1 xfer2 xfer3
size=$(( ($(stat -c %s vllm.tar.xz) + 2) / 3 ))
split -b "$size" -a 2 vllm.tar.xz xfer1/vllm.tar.xz.part-
mv xfer1/vllm.tar.xz.part-ab xfer2/ && mv xfer1/vllm.tar.xz.part-ac xfer3/
cp deps.tar.xz xfer1/
(cd xfer1 && sha256sum vllm.tar.xz.part-aa; cd ../xfer2 && sha256sum vllm.tar.xz.part-ab; \
 cd ../xfer3 && sha256sum vllm.tar.xz.part-ac) > xfer3/manifest.sha256
du -sh xfer1 xfer2 xfer3
