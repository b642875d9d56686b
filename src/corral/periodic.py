"""Doing one thing every so often while a block runs: restamping a submission's attempts, renewing a
store lock. Cost: one asyncio task per block, woken once a period."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager


@asynccontextmanager
async def repeating(period: float, action: Callable[[], object]) -> AsyncIterator[None]:
    """Call `action` every `period` seconds (the first after one period) until the block ends."""
    async def keep_doing() -> None:
        while True:
            await asyncio.sleep(period)
            action()

    keeper = asyncio.ensure_future(keep_doing())
    try:
        yield
    finally:
        keeper.cancel()
