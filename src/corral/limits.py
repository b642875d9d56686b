"""Limits that a client and the server both hold, read in one place (standard library only: the thin
CLI imports it). Cost: an environment lookup per call."""

from __future__ import annotations

import os

from corral.errors import TaskError

DEFAULT_SEND_LIMIT = 8 << 30


def send_limit() -> int:
    """The most one upload may hold (CORRAL_MAX_UPLOAD_BYTES, 8 GiB by default): what a client sends,
    and what a server takes (a server set lower than its client refuses, naming its own)."""
    raw = os.environ.get("CORRAL_MAX_UPLOAD_BYTES", "")
    if not raw:
        return DEFAULT_SEND_LIMIT
    try:
        return int(raw)
    except ValueError:
        raise TaskError(f"CORRAL_MAX_UPLOAD_BYTES={raw!r} is not a number of bytes") from None
