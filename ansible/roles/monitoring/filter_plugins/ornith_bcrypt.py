"""The `ornith_bcrypt` filter of the monitoring role: the bcrypt hash of the monitoring password for
Prometheus' and Alertmanager's web config (host mode), the hash already on the host when it still matches.

On the controller, from this checkout's ornith_stack (ornith_stack.generate.monitoring_auth, the one place
the hash is made for compose too): Ansible's own password_hash needs passlib, which the project does not use.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

try:
    from ornith_stack.generate.monitoring_auth import kept_hash
except ImportError:  # a controller running this checkout's playbooks without installing it
    sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "src"))
    from ornith_stack.generate.monitoring_auth import kept_hash


def ornith_bcrypt(password: str, previous: str = "") -> str:
    return kept_hash(str(password), str(previous or ""))


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"ornith_bcrypt": ornith_bcrypt}
