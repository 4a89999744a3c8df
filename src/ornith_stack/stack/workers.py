"""The Model Gateway's worker API (smg 0.3.2), with the operator's credential: which replicas are in its
rotation, and taking one out or putting it back. `up`'s rolling change and `status` read it.

smg removes a worker by the id its `GET /workers` lists (a URL in the path gets 400) and queues additions and
removals (each took under a second, measured); a caller waits until the list shows the change."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from ornith_stack import deployment
from ornith_stack.errors import UserError
from ornith_stack.stack.envfile import OPERATOR_VAR
from ornith_stack.wire.http import Answer, WireError, bearer, fetch

# smg queues worker additions and removals; its job queue took under a second for each (measured, 0.3.2).
ROTATION_TIMEOUT_S = 60.0
ROTATION_POLL_S = 0.5


@dataclass(frozen=True)
class Worker:
    id: str
    healthy: bool


@dataclass(frozen=True)
class Gateway:
    """smg's worker routes at `base` (http://host:port), with the operator's credential."""

    base: str
    key: str

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None, gone_ok: bool = False) -> Answer:
        try:
            answer = fetch(self.base + path, 30, method, headers=bearer(self.key), json=body)
        except WireError as exc:
            raise UserError(f"the gateway at {self.base} does not answer {method} {path} ({exc.reason}): "
                            "`ornith-stack logs gateway`") from None
        if answer.status in (401, 403):
            raise UserError(f"the gateway refused {OPERATOR_VAR} on {method} {path} (HTTP {answer.status}): it runs "
                            "with another operator credential; `ornith-stack up --all-at-once` restarts it with this one")
        if answer.status >= 300 and not (gone_ok and answer.status == 404):
            raise UserError(f"the gateway answered {method} {path} with HTTP {answer.status}: {answer.text[:200]} "
                            "(`ornith-stack logs gateway`)")
        return answer

    def workers(self) -> dict[str, Worker]:
        """The replicas in rotation, by URL."""
        try:
            listed = self._call("GET", deployment.GATEWAY_WORKERS_PATH).json()["workers"]
            return {str(w["url"]): Worker(str(w["id"]), w.get("is_healthy") is True) for w in listed}
        except (ValueError, KeyError, TypeError, RecursionError):
            raise UserError(f"the gateway at {self.base} lists its workers in a shape smg 0.3.2 does not write: "
                            "`ornith-stack logs gateway`") from None

    def take_out(self, url: str) -> bool:
        """Out of rotation (False: it was not in it)."""
        worker = self.workers().get(url)
        if worker is None:
            return False
        self._call("DELETE", f"{deployment.GATEWAY_WORKERS_PATH}/{quote(worker.id, safe='')}", gone_ok=True)
        self._await(url, listed=False)
        return True

    def put_back(self, url: str) -> None:
        if url not in self.workers():
            self._call("POST", deployment.GATEWAY_WORKERS_PATH, {"url": url})
        self._await(url, listed=True)

    def _await(self, url: str, listed: bool) -> None:
        deadline = time.monotonic() + ROTATION_TIMEOUT_S
        while (url in self.workers()) != listed:
            if time.monotonic() > deadline:
                raise UserError(f"the gateway did not {'list' if listed else 'drop'} {url} within "
                                f"{ROTATION_TIMEOUT_S:.0f} s: `ornith-stack logs gateway`")
            time.sleep(ROTATION_POLL_S)
