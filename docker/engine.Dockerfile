# GPU engine image (SGLang or vLLM): the pinned upstream engine image, plus ornith-stack (doctor,
# launch-args) and the entrypoint that checks the machine and then execs the engine with the profile's
# flags (`ornith-stack entrypoint`, src/ornith_stack/stack/entrypoint.py). One file for every GPU profile; the engines differ only in build args,
# which compose/<profile>.yml passes (build.args) from src/ornith_stack/images.yaml and the profile:
#
#   docker build -f docker/engine.Dockerfile -t ornith-stack/sglang:0.5.17 .     (the defaults below)
#   docker build -f docker/engine.Dockerfile -t ornith-stack/vllm:0.24.0 \
#     --build-arg BASE_IMAGE=vllm/vllm-openai:v0.24.0 --build-arg TRANSFORMERS_VERSION= .
#   docker build -f docker/engine.Dockerfile -t ornith-stack/sglang:0.5.21 \
#     --build-arg BASE_IMAGE=lmsysorg/sglang:v0.5.21-cu130 --build-arg TRANSFORMERS_VERSION= .
#
# The defaults are the pins of SGLang 0.5.17 (seed 000: "Use lmsysorg/sglang:v0.5.17-cu129. Keep
# transformers at 5.12.1 with SGLang 0.5.17."); tests/unit/test_docker.py checks they equal images.yaml.
# SGLang publishes its CUDA 12.9 images under the plain tag v0.5.17; when the -cu129 tag cannot be
# pulled, build with --build-arg BASE_IMAGE=lmsysorg/sglang:v0.5.17 (compose: ORNITH_ENGINE_BASE_IMAGE).
ARG BASE_IMAGE=lmsysorg/sglang:v0.5.17-cu129
FROM ${BASE_IMAGE}
# transformers version installed into the engine's Python; empty: keep the image's own.
ARG TRANSFORMERS_VERSION=5.12.1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The pin goes into the engine's own Python on purpose (PEP 668 markers would refuse it).
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1
RUN if [ -n "$TRANSFORMERS_VERSION" ]; then python3 -m pip install "transformers==${TRANSFORMERS_VERSION}"; fi
# ornith-stack gets a virtual environment of its own, so its dependencies never move the engine's. Images
# whose Python lacks ensurepip (Ubuntu without python3-venv) get one without pip, and the system pip puts
# one in. Its dependencies come first, in a layer of their own (it changes with pyproject.toml only); the
# project's source after, installed without them: a change to src/ rebuilds one small layer.
COPY pyproject.toml README.md docker/pyproject-requirements.py /tmp/ornith/
RUN { python3 -m venv /opt/ornith \
      || { rm -rf /opt/ornith && python3 -m venv --without-pip /opt/ornith \
           && python3 -m pip --python /opt/ornith/bin/python install pip; }; } \
 && python3 /tmp/ornith/pyproject-requirements.py /tmp/ornith/pyproject.toml > /tmp/ornith/requirements.txt \
 && /opt/ornith/bin/python -m pip install -r /tmp/ornith/requirements.txt
# The upstream engine images run as root and keep their caches under /root/.cache; so does this one.
ENV HF_HOME=/data/hf
ENTRYPOINT ["ornith-stack", "entrypoint"]
# Last: the steps a change to src/ redoes.
COPY src/ /tmp/ornith/src/
RUN /opt/ornith/bin/python -m pip install --no-deps --no-build-isolation /tmp/ornith \
 && ln -s /opt/ornith/bin/ornith-stack /usr/local/bin/ornith-stack \
 && rm -rf /tmp/ornith
