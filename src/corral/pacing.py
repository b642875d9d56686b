"""Backpressure for output streams (a job's logs, an exec's output).

Whoever takes a stream's output (the API's response, at the pace of its client) sets a pace: an
awaitable that returns once it has room again. A reader of remote output awaits `keep_pace()` after
each chunk it hands to its sink, so that a client that stops reading (`corral logs JOB | less`, paused)
stops the reading too, rather than the server holding the whole log for it. A context variable, so
that it reaches the readers through any backend without being passed along. Cost: one lookup a chunk.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar

OUTPUT_PACE: ContextVar[Callable[[], Awaitable[None]] | None] = ContextVar("corral_output_pace", default=None)


async def keep_pace() -> None:
    """Wait until whoever takes this stream's output has room for more (at once when nobody set a pace)."""
    pace = OUTPUT_PACE.get()
    if pace is not None:
        await pace()
