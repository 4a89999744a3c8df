"""A Docker API socket that forwards to this machine's daemon and answers GPU requests as NVIDIA's driver would.

This machine's dockerd (20.10) has no GPU device driver: it registers NVIDIA's only when
`nvidia-container-runtime-hook` is on its PATH at start, and it cannot be restarted here. A host that talks to
the daemon through this socket sends exactly what it would send on a GPU host (`docker run --gpus ...`,
compose's `deploy.resources.reservations.devices`); a container-create request with a device request for
NVIDIA GPUs is recorded (`requests`), and answered the way moby's NVIDIA driver (daemon/nvidia_linux.go)
answers it: the device request is taken off and the container gets `NVIDIA_VISIBLE_DEVICES` ("all" for
count -1, "0,...,n-1" for count n, the device IDs otherwise). What the driver's prestart hook would add
(the device nodes and the driver's libraries) does not exist here, so NVML stays absent in the container.
A device request for another driver passes through unchanged: the daemon refuses it as it would anyway.

Every other byte is passed through unchanged, streams and upgraded (hijacked) connections included.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from pathlib import Path
from typing import Any

_CREATE = re.compile(rb"^POST (/v[\d.]+)?/containers/create[?\s]")
# moby's NVIDIA driver: driver "nvidia", or no driver and the capabilities "gpu" (or "nvidia").
_NVIDIA_CAPABILITIES = {"gpu", "nvidia"}


def _is_nvidia(request: dict[str, Any]) -> bool:
    if request.get("Driver") not in ("", None, "nvidia"):
        return False
    if request.get("Driver") == "nvidia":
        return True
    return any(set(caps) <= _NVIDIA_CAPABILITIES for caps in request.get("Capabilities") or [])


def _visible_devices(request: dict[str, Any]) -> str:
    if request.get("DeviceIDs"):
        return ",".join(request["DeviceIDs"])
    count = int(request.get("Count") or 0)
    return "all" if count < 0 else ",".join(str(i) for i in range(count))


class GpuStubSocket:
    """Listen on `path`, forward to `upstream`; `requests` lists (image, device requests) of each GPU create."""

    def __init__(self, path: Path, upstream: str = "/var/run/docker.sock") -> None:
        self.path = path
        self.upstream = upstream
        self.requests: list[tuple[str, list[dict[str, Any]]]] = []
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        path.chmod(0o666)
        self._server.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self.upstream)
            threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()
            threading.Thread(target=self._requests, args=(client, upstream), daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket) -> None:
        """Forward the client's requests one by one; rewrite GPU creates; after an upgrade, pass bytes through."""
        reader = client.makefile("rb")
        try:
            while True:
                head = _read_head(reader)
                if not head:
                    break
                headers = _headers(head)
                if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
                    upstream.sendall(head)
                    _forward_chunked(reader, upstream)
                    continue
                body = reader.read(int(headers.get(b"content-length", b"0")))
                if _CREATE.match(head):
                    head, body = self._answer_gpus(head, body)
                upstream.sendall(head + body)
                if b"upgrade" in headers.get(b"connection", b"").lower():
                    _pump_file(reader, upstream)
                    break
        except OSError:
            pass
        finally:
            _close(upstream, socket.SHUT_WR)

    def _answer_gpus(self, head: bytes, body: bytes) -> tuple[bytes, bytes]:
        spec = json.loads(body or b"{}")
        host_config = spec.get("HostConfig") or {}
        requests = host_config.get("DeviceRequests") or []
        nvidia = [request for request in requests if _is_nvidia(request)]
        if not nvidia:
            return head, body
        self.requests.append((spec.get("Image", ""), nvidia))
        host_config["DeviceRequests"] = [request for request in requests if not _is_nvidia(request)]
        spec["Env"] = [*(spec.get("Env") or []), *(f"NVIDIA_VISIBLE_DEVICES={_visible_devices(r)}" for r in nvidia)]
        body = json.dumps(spec).encode()
        head = re.sub(rb"(?im)^content-length:.*\r\n", b"Content-Length: %d\r\n" % len(body), head)
        return head, body


def _read_head(reader: Any) -> bytes:
    lines = []
    while True:
        line = reader.readline()
        if not line:
            return b""
        lines.append(line)
        if line in (b"\r\n", b"\n"):
            return b"".join(lines)


def _headers(head: bytes) -> dict[bytes, bytes]:
    out = {}
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            out[name.strip().lower()] = value.strip()
    return out


def _forward_chunked(reader: Any, upstream: socket.socket) -> None:
    while True:
        size_line = reader.readline()
        upstream.sendall(size_line)
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while True:  # trailers, then the empty line
                line = reader.readline()
                upstream.sendall(line)
                if line in (b"\r\n", b"\n", b""):
                    return
        remaining = size + 2  # the data and its CRLF
        while remaining:
            data = reader.read(min(remaining, 1 << 20))
            if not data:
                raise OSError("client closed inside a chunk")
            upstream.sendall(data)
            remaining -= len(data)


def _pump_file(reader: Any, target: socket.socket) -> None:
    while data := reader.read1(1 << 20):
        target.sendall(data)


def _pump(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(1 << 20):
            target.sendall(data)
    except OSError:
        pass
    finally:
        _close(target, socket.SHUT_WR)


def _close(sock: socket.socket, how: int) -> None:
    try:
        sock.shutdown(how)
    except OSError:
        pass
