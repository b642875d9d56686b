"""Work the server runs on after whoever asked for it stops waiting: a launch whose client went
away, a detached exec, a queued exec the engine starts. Standard library only; no cost of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

_RUNNING: set[asyncio.Future[Any]] = set()  # kept referenced until they end (the loop holds tasks weakly)


def run_on(work: Awaitable[Any]) -> asyncio.Future[Any]:
    """`work` as a task of its own, kept until it ends: a client that stops waiting for it (goes away,
    or detaches) does not stop it."""
    running = asyncio.ensure_future(work)
    _RUNNING.add(running)
    running.add_done_callback(_RUNNING.discard)
    return running
