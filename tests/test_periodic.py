"""corral.periodic: an action repeated while a block runs, and stopped with it."""

import asyncio
import time

from corral.periodic import repeating


def test_the_action_repeats_while_the_block_runs_and_stops_with_it():
    calls: list[float] = []

    async def main() -> None:
        async with repeating(0.01, lambda: calls.append(time.monotonic())):
            assert calls == []  # the first call comes after one period, not at once
            deadline = time.monotonic() + 5
            while len(calls) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
        assert len(calls) >= 3
        await asyncio.sleep(0)  # the cancelled keeper's last step
        assert asyncio.all_tasks() == {asyncio.current_task()}  # no keeper outlives the block

    asyncio.run(main())


def test_the_action_stops_when_the_block_raises():
    async def main() -> None:
        try:
            async with repeating(0.01, lambda: None):
                raise KeyError("x")
        except KeyError:
            pass
        await asyncio.sleep(0)  # the cancelled keeper's last step
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(main())
