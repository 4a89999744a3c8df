# SGLang Model Gateway (PyPI sglang-router): one OpenAI-compatible endpoint in front of a profile's
# data-parallel engine replicas, cache-aware routing, its own Prometheus metrics (smg_*).
#
#   docker build -f docker/gateway.Dockerfile -t ornith-stack/model-gateway:0.3.2 .
#   docker run --rm -p 127.0.0.1:30000:30000 -e ORNITH_API_KEY ornith-stack/model-gateway:0.3.2 \
#     --worker-urls http://engine-0:30000 http://engine-1:30000 --policy cache_aware --host 0.0.0.0 --port 30000
#
# The entrypoint (src/ornith_stack/gateway_launch.py) gives smg the key in $ORNITH_API_KEY off its command line
# (smg 0.3.2 reads it from the flag --api-key only): without the key, every route but /v1/models and the
# health routes answers 401, the worker-management ones (/workers, /get_loads, /flush_cache) included.
#
# BASE_IMAGE and SGLANG_ROUTER_VERSION: defaults pinned in src/ornith_stack/images.yaml (bases.python,
# gateway.python_pins); compose passes the same values.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE}
ARG SGLANG_ROUTER_VERSION=0.3.2
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/python -m pip install "sglang-router==${SGLANG_ROUTER_VERSION}" \
 && /opt/venv/bin/python -m pip uninstall --yes --quiet pip \
 && groupadd --gid 10001 ornith \
 && useradd --uid 10001 --gid ornith --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin ornith
COPY src/ornith_stack/gateway_launch.py /usr/local/bin/ornith-gateway
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1
USER 10001:10001
EXPOSE 30000 29000
# /readiness answers 200 once at least one worker is healthy (/liveness as soon as the process runs).
HEALTHCHECK --interval=15s --timeout=5s --start-period=900s --retries=5 \
  CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:30000/readiness', timeout=4)"]
ENTRYPOINT ["python3", "/usr/local/bin/ornith-gateway"]
