# vLLM engine image: the pinned upstream image, plus ornith-stack (doctor, launch-args) and the entrypoint
# that checks the machine and then execs the engine with the profile's flags (docker/entrypoint.sh).
#
#   docker build -f docker/vllm.Dockerfile -t ornith-stack/vllm:VERSION .
# vLLM 0.24.0 (seed 003); the image ships torch 2.11.0+cu130 and its own transformers.
# The defaults below are the pins of src/ornith_stack/images.yaml (tests/unit/test_docker.py checks it);
# compose passes each profile's own (compose/<profile>.yml, build.args).
ARG BASE_IMAGE=vllm/vllm-openai:v0.24.0
FROM ${BASE_IMAGE}
# Empty: keep the image's own transformers.
ARG TRANSFORMERS_VERSION=
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The pin goes into the engine's own Python on purpose (PEP 668 markers would refuse it).
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1
RUN if [ -n "$TRANSFORMERS_VERSION" ]; then python3 -m pip install "transformers==${TRANSFORMERS_VERSION}"; fi
COPY pyproject.toml README.md /tmp/ornith/
COPY src/ /tmp/ornith/src/
# ornith-stack gets a virtual environment of its own, so its dependencies never move the engine's. Images
# whose Python lacks ensurepip (Ubuntu without python3-venv) get one without pip, filled by the system pip.
RUN { python3 -m venv /opt/ornith && /opt/ornith/bin/python -m pip install /tmp/ornith; } \
 || { rm -rf /opt/ornith && python3 -m venv --without-pip /opt/ornith \
      && python3 -m pip --python /opt/ornith/bin/python install /tmp/ornith; } \
 && ln -s /opt/ornith/bin/ornith-stack /usr/local/bin/ornith-stack \
 && rm -rf /tmp/ornith
COPY docker/entrypoint.sh /usr/local/bin/ornith-entrypoint
ENV HF_HOME=/data/hf
ENTRYPOINT ["/usr/local/bin/ornith-entrypoint"]
