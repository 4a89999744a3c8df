# The ornith-stack exporter: engine /metrics -> unified ornith_* metrics on :9400 (see monitoring/README.md).
#
#   docker build -f docker/exporter.Dockerfile -t ornith-stack/exporter:0.1.0 .
#   docker run --rm -p 127.0.0.1:9400:9400 ornith-stack/exporter:0.1.0 --target http://HOST:8000 --profile cpu-demo
#
# BASE_IMAGE: any Debian with Python 3.11+ (default pinned in src/ornith_stack/images.yaml, bases.python).
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
# The dependencies in a layer of their own (it changes with pyproject.toml only), then the project without
# them: a change to src/ rebuilds one small layer instead of downloading every dependency again (72 s for
# Ansible's exporter-only change on a 2-core machine before).
COPY pyproject.toml README.md docker/pyproject-requirements.py /tmp/ornith/
RUN python3 -m venv /opt/venv \
 && python3 /tmp/ornith/pyproject-requirements.py /tmp/ornith/pyproject.toml > /tmp/ornith/requirements.txt \
 && /opt/venv/bin/python -m pip install -r /tmp/ornith/requirements.txt
COPY src/ /tmp/ornith/src/
# pip (16 MB) and wheel are not needed at run time.
RUN /opt/venv/bin/python -m pip install --no-deps --no-build-isolation /tmp/ornith \
 && /opt/venv/bin/python -m pip uninstall --yes --quiet wheel pip

FROM ${BASE_IMAGE}
RUN groupadd --gid 10001 ornith \
 && useradd --uid 10001 --gid ornith --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin ornith
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1
USER 10001:10001
EXPOSE 9400
# The landing page, not /metrics: a health probe should not trigger a scrape of every engine.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
  CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9400/', timeout=4)"]
ENTRYPOINT ["ornith-stack", "exporter"]
CMD ["--target", "http://engine:8000", "--listen", ":9400"]
# Last: the one step a change to src/ redoes here (each step after it would be redone too, seconds apiece).
COPY --from=build /opt/venv /opt/venv
