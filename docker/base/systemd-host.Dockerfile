# A Debian host stand-in for Ansible integration tests: systemd as PID 1, python3 for Ansible, sudo, no GPU.
# Run it (see scripts/make-base-images.sh for why these flags):
#   docker run -d --cgroupns=host -v /sys/fs/cgroup:/sys/fs/cgroup:rw \
#     --tmpfs /run --tmpfs /run/lock ornith-local/systemd-host:bookworm
# (--privileged fails on this Docker: its daemon lacks CAP_SYS_RESOURCE.)
ARG BASE_IMAGE=ornith-local/debian:bookworm
FROM ${BASE_IMAGE}

ENV container=docker

# python3-apt: Ansible's apt module needs it. procps/iproute2/curl: what a real host has for checks.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      systemd systemd-sysv dbus python3 python3-apt sudo procps iproute2 curl ca-certificates \
 && rm -rf /var/lib/apt/lists/*

# Units that need real hardware, a console or a kernel the container does not own would fail and leave
# the system "degraded"; mask them so `systemctl is-system-running` reports a clean state.
RUN systemctl mask \
      getty@tty1.service console-getty.service serial-getty@.service \
      systemd-udevd.service systemd-udev-trigger.service systemd-udevd-control.socket \
      systemd-udevd-kernel.socket systemd-modules-load.service sys-kernel-config.mount \
      sys-kernel-debug.mount sys-kernel-tracing.mount systemd-remount-fs.service \
      systemd-firstboot.service systemd-logind.service getty.target \
 && rm -f /etc/machine-id \
 && touch /etc/machine-id

# systemd stops cleanly on SIGRTMIN+3 (docker stop), not on SIGTERM.
STOPSIGNAL SIGRTMIN+3
CMD ["/sbin/init"]
