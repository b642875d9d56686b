"""Limits that a client and the server both hold, read in one place (standard library only: the thin
CLI imports it). Cost: an environment lookup per call."""

from __future__ import annotations

from corral.config import env_number

DEFAULT_SEND_LIMIT = 8 << 30


def send_limit() -> int:
    """The most one upload may hold (CORRAL_MAX_UPLOAD_BYTES, 8 GiB by default): what a client sends,
    and what a server takes (a server set lower than its client refuses, naming its own)."""
    return int(env_number("CORRAL_MAX_UPLOAD_BYTES", DEFAULT_SEND_LIMIT, unit="bytes"))
