# Stand-in for prom/prometheus where no registry is reachable: Debian's prometheus package (2.42).
# Laid out like the upstream image (config /etc/prometheus/prometheus.yml, data /prometheus, port 9090)
# so that the same compose file runs either. It stands in for prom/alertmanager too: Debian's
# prometheus-alertmanager as /bin/alertmanager with its data in /alertmanager, as upstream lays it out. Healthchecks: `wget -qO- http://127.0.0.1:9090/-/ready`
# works here and in the upstream (busybox) image; curl is in neither.
ARG BASE_IMAGE=ornith-local/debian:bookworm
FROM ${BASE_IMAGE}

# The prometheus user is made first with a fixed id (the package keeps an existing one), so USER is
# numeric and a host can chown a bind-mounted data directory to 990:990.
# hadolint ignore=DL3008
RUN groupadd --system --gid 990 prometheus \
 && useradd --system --uid 990 --gid prometheus --home-dir /var/lib/prometheus \
      --no-create-home --shell /usr/sbin/nologin prometheus \
 && apt-get update \
 && apt-get install -y --no-install-recommends prometheus prometheus-alertmanager wget \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s /usr/bin/prometheus-alertmanager /bin/alertmanager \
 && mkdir -p /prometheus /alertmanager \
 && chown 990:990 /prometheus /alertmanager

USER 990:990
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
