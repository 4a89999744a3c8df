# Stand-in for a "Debian + Python" base where no registry is reachable (made by scripts/make-base-images.sh).
# Debian's own Python 3.11 with venv and pip, and curl for healthchecks. No engine inside.
ARG BASE_IMAGE=ornith-local/debian:bookworm
FROM ${BASE_IMAGE}

# Versions are not pinned: bookworm point releases replace them, and the rootfs decides the snapshot.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3 python3-venv python3-pip python-is-python3 curl ca-certificates \
 && rm -rf /var/lib/apt/lists/*

# Debian marks its Python as externally managed (PEP 668); images install into it on purpose, as root.
ENV PIP_BREAK_SYSTEM_PACKAGES=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1

CMD ["python3"]
