"""Which server runs for this Corral home, from the files it keeps there: its pid, its log, and
`controller.json` (its port, bearer token and settings, mode 600). Standard library only: a command
that finds its server running reads these without importing the server's module (controller/server.py,
which starts and stops it). Cost: two small file reads and one of /proc.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corral.config import corral_home
from corral.errors import UnavailableError


class ControllerUnavailable(UnavailableError):
    pass


def pid_file() -> Path:
    return corral_home() / "controller.pid"


def log_file() -> Path:
    return corral_home() / "controller.log"


def endpoint_file() -> Path:
    return corral_home() / "controller.json"


def running_pid() -> int | None:
    try:
        pid = int(pid_file().read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"corral.controller" not in f.read():
                return None
    except OSError:
        return None
    return pid


def read_endpoint() -> dict[str, Any] | None:
    """The running server's port, token and settings (None if it does not run)."""
    try:
        endpoint = json.loads(endpoint_file().read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(endpoint, dict) or running_pid() != endpoint.get("pid"):
        return None
    return endpoint
