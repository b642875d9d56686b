"""Submissions to one machine of a pool, sent together (group commit).

A sweep submits its tasks all at once, and each task's start is a script (runner.submit_script) that
claims its GPUs and starts it under the machine's lock. The scripts that arrive while a round trip to
the machine is on its way go together in the next one, each in its own subshell, with a line after
each that tells their answers apart: a sweep of 400 tasks costs a round trip per 64 of them, not 400,
and a lone submission waits for nothing. The workdir's cache on the machine (infra/caches.py) is
synced once for the consecutive tasks that read the same upload into it, under the cache's lock,
which is held until the round trip that copies it into their run directories has ended.

Cost: one round trip per batch of at most BATCH scripts, plus one rsync per distinct workdir upload
in a run of batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from corral.errors import ClusterError, RemoteCommandError
from corral.infra import caches

BATCH = 64  # scripts per round trip: each takes a few milliseconds on the machine
PART_END = "@@corral-part-end"
_PART_END_LINE = re.compile(rf"^{PART_END} (\d+) (\d+)\Z")


@dataclass(frozen=True)
class CacheSync:
    """The workdir upload a script's copy reads from the machine's cache `key` (caches.cache_path)."""

    local: Path
    key: str


@dataclass
class _Entry:
    script: str
    cache: CacheSync | None
    answer: asyncio.Future[str] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


def combined(scripts: Sequence[str]) -> str:
    """One bash script that runs each of `scripts` in its own subshell (an `exit` ends that one only),
    none reading the session's stdin (the script itself), its stderr in its output (what a failure
    says), each followed by `PART_END <index> <status>`."""
    return "".join(f"(\n{script}\n) </dev/null 2>&1\nprintf '\\n{PART_END} {index} %d\\n' $?\n"
                   for index, script in enumerate(scripts))


def answers(stdout: str, count: int) -> list[tuple[int, str] | None]:
    """Each script's (exit status, output) from a `combined` run's stdout; None for those that did not
    finish (the session ended first)."""
    found: list[tuple[int, str] | None] = [None] * count
    lines: list[str] = []
    for line in stdout.splitlines():
        end = _PART_END_LINE.match(line)
        if end is None:
            lines.append(line)
            continue
        index = int(end.group(1))
        if index < count:
            found[index] = (int(end.group(2)), "\n".join(lines).strip("\n"))
        lines = []
    return found


class MachineSubmissions:
    """The submissions to `host` waiting for their round trip; one round trip at a time."""

    def __init__(self, host: str, run: Callable[[str, float], Awaitable[str]],
                 sync: Callable[[CacheSync], Awaitable[None]], timeout: float):
        self.host = host
        self._run = run  # (script, timeout) -> stdout; raises ClusterError when the session fails
        self._sync = sync
        self._timeout = timeout
        self._queue: list[_Entry] = []
        self._drain: asyncio.Task[None] | None = None

    async def submit(self, script: str, cache: CacheSync | None = None) -> str:
        """The script's output, once it has run on the machine (after `cache` is synced, when given).
        Raises ClusterError when the session, the sync or the script failed."""
        entry = _Entry(script, cache)
        self._queue.append(entry)
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_task(self._send_all())
        return await entry.answer

    async def _send_all(self) -> None:
        synced: dict[str, Path] = {}  # what this run of batches put in each cache; forgotten when it ends
        try:
            while self._queue:
                batch = self._take()
                if batch:
                    await self._send(batch, synced)
        except BaseException:  # the server is stopping: no submitter is left waiting
            _settle(self._queue, [ClusterError(self.host, "the server stopped before this submission")]
                    * len(self._queue))
            self._queue.clear()
            raise
        finally:
            self._drain = None

    def _take(self) -> list[_Entry]:
        """The next batch: consecutive entries that read the same cache (or none), at most BATCH; those
        whose submitter has gone are dropped, never started."""
        batch: list[_Entry] = []
        while self._queue and len(batch) < BATCH:
            entry = self._queue[0]
            if batch and entry.cache != batch[0].cache:
                break
            self._queue.pop(0)
            if not entry.answer.done():
                batch.append(entry)
        return batch

    async def _send(self, batch: list[_Entry], synced: dict[str, Path]) -> None:
        cache = batch[0].cache
        lock = caches.cache_lock(self.host, cache.key) if cache else contextlib.nullcontext()
        try:
            async with lock:  # no other sync into the cache between this one and the copies from it
                if cache is not None and synced.get(cache.key) != cache.local:
                    synced.pop(cache.key, None)
                    await self._sync(cache)
                    synced[cache.key] = cache.local
                stdout = await self._run(combined([e.script for e in batch]),
                                         self._timeout + len(batch) - 1)
        except ClusterError as exc:
            _settle(batch, [exc] * len(batch))
            return
        except Exception as exc:  # noqa: BLE001 - whatever it was, each submitter hears of it
            _settle(batch, [ClusterError(self.host, f"submission failed: {exc}")] * len(batch))
            return
        except BaseException:
            _settle(batch, [ClusterError(self.host, "the server stopped before this submission")] * len(batch))
            raise
        _settle(batch, [self._outcome(part) for part in answers(stdout, len(batch))])

    def _outcome(self, part: tuple[int, str] | None) -> str | ClusterError:
        if part is None:
            return ClusterError(self.host, "the session ended before this submission's answer")
        status, output = part
        if status != 0:
            last = output.splitlines()[-1] if output else "no output"
            return RemoteCommandError(self.host, f"submission failed: {last}", exit_status=status, stderr=output)
        return output


def _settle(batch: list[_Entry], outcomes: Sequence[str | ClusterError]) -> None:
    for entry, outcome in zip(batch, outcomes):
        if entry.answer.done():
            continue
        if isinstance(outcome, ClusterError):
            entry.answer.set_exception(outcome)
        else:
            entry.answer.set_result(outcome)
