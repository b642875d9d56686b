"""The pool's pieces that need no machine: a multi-node task's status made whole, or found in part, and its
ranks' output read together."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from corral.infra.base import JobState
from corral.config import PoolEntry
from corral.errors import ClusterUnreachableError
from corral.infra.sshpool.pool import NOT_FOUND, SILENT_WAIT_SECONDS, SshPoolInfra, _stray_ranks, _whole_tasks
from corral.ssh import RemoteResult
from tests.fakes import status


def ranks_of(token: str, found: dict[int, str], count: int, state: JobState = JobState.RUNNING):
    """The pool's view of a task's ranks no handle names: (machine, rank token) -> status, and each rank
    token's machine and task size (its `@@corral ranks` line)."""
    unnamed = {(host, f"{token}.{r}"): status(f"{host}/{token}.{r}", f"{token}.{r}", state)
               for r, host in found.items()}
    nodes = {f"{token}.{r}": (host, count) for r, host in found.items()}
    return unnamed, nodes


def test_a_task_whose_every_rank_is_found_is_one_status_its_handle_naming_the_machines_in_rank_order():
    unnamed, nodes = ranks_of("tok1", {1: "lab3", 0: "lab2"}, 2)
    [task] = _whole_tasks(unnamed, nodes)
    assert (task.handle, task.token, task.state, task.partial) == ("lab2,lab3/tok1", "tok1", JobState.RUNNING, False)


def test_a_task_found_in_part_is_partial_its_handle_marking_the_ranks_not_found():
    """What a server killed half-way through starting the ranks leaves: cancellable, never adopted."""
    unnamed, nodes = ranks_of("tok2", {0: "lab1", 2: "lab4"}, 3)
    [task] = _whole_tasks(unnamed, nodes)
    assert task.handle == f"lab1,{NOT_FOUND},lab4/tok2" and task.token == "tok2" and task.partial


def test_ranks_that_disagree_on_their_tasks_size_or_lie_beyond_it_are_no_task():
    unnamed, nodes = ranks_of("tok3", {0: "lab1", 1: "lab2"}, 2)
    nodes["tok3.1"] = ("lab2", 3)
    assert _whole_tasks(unnamed, nodes) == []
    unnamed, nodes = ranks_of("tok4", {0: "lab1", 5: "lab2"}, 2)
    assert _whole_tasks(unnamed, nodes) == []


def test_a_multi_node_log_snapshot_keeps_each_ranks_output_aside_on_disk_not_in_memory():
    """`logs` of a 2-node task without --follow prints rank 0's output, then rank 1's, each line after
    its rank's label; both are read at once, so rank 1's waits somewhere meanwhile: past 1 MiB, on disk.
    2 x 8 MB of output cost the engine under 4 MB (both ranks' whole output in memory before, then a copy
    of each: 34 MB)."""
    import asyncio
    import tracemalloc

    from corral.config import PoolEntry
    from corral.infra.sshpool.pool import SshPoolInfra

    chunk, chunks = 64 * 1024, 128

    class Talkative:
        async def stream(self, host, script, on_output):
            for _ in range(chunks):
                on_output(script.encode() * (chunk - 1) + b"\n")  # one letter a rank, a line a chunk
                await asyncio.sleep(0)  # the ranks' output arrives interleaved
            return 0

    pool = SshPoolInfra(PoolEntry("lab", ("lab1", "lab2"), ()), transport=Talkative())  # type: ignore[arg-type]
    seen: list[tuple[bytes, int]] = []  # (letter, how many) in the order printed, runs merged
    lines: dict[bytes, int] = {b"0: ": 0, b"1: ": 0, b"\n": 0}

    def sink(data: bytes) -> None:
        for mark in lines:
            lines[mark] += data.count(mark)
        for byte in (b"a", b"b"):
            count = data.count(byte)
            if count and seen and seen[-1][0] == byte:
                seen[-1] = (byte, seen[-1][1] + count)
            elif count:
                seen.append((byte, count))

    tracemalloc.start()
    try:
        asyncio.run(pool._every_rank_output(["lab1", "lab2"], lambda rank: "ab"[rank], False, sink))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert seen == [(b"a", chunks * (chunk - 1)), (b"b", chunks * (chunk - 1))]
    assert lines == {b"0: ": chunks, b"1: ": chunks, b"\n": 2 * chunks}
    assert peak < 4 * 2**20, peak


def test_a_followed_ranks_output_passes_in_whole_lines_progress_bars_included_and_never_piles_up():
    """Several machines' output shares one stream, so each passes in whole lines. A progress bar's
    updates end with a carriage return, not a newline: they pass as they come. Output with no line end
    at all passes once LINE_LIMIT of it is kept back, rather than pile up until the stream ends."""
    from corral.infra.ranks import LINE_LIMIT, WholeLines
    from corral.infra.sshpool.pool import _UntilLine

    out: list[bytes] = []
    sink = WholeLines(out.append)
    sink(b"epoch 1\nepo")
    assert out == [b"epoch 1\n"] and sink.partial == b"epo"
    sink(b"ch 2\n")
    for percent in range(0, 100, 10):
        sink(f"\r{percent}%|{'#' * (percent // 10)}".encode())
    assert out[1:4] == [b"epoch 2\n", b"\r", b"0%|\r"]  # each update as soon as the next one begins
    assert out[-1] == b"80%|########\r" and sink.partial == b"90%|#########"
    out.clear()
    for _ in range(40):
        sink(b"\x00" * 4096)  # no line end, ever
    assert out and len(sink.partial) <= LINE_LIMIT + 4096
    assert sum(map(len, out)) + len(sink.partial) == 40 * 4096 + len(b"90%|#########")
    sink.flush()
    assert sink.partial == b""

    seen: list[bytes] = []
    awaiting = _UntilLine("@@ready", lambda: None, seen.append)
    for _ in range(40):
        awaiting(b"x" * 4096)
    assert len(awaiting.partial or b"") <= LINE_LIMIT + 4096 and seen


@pytest.mark.parametrize("follow", [False, True])
def test_a_rank_whose_machine_does_not_answer_leaves_the_others_output_shown_then_says_so(follow):
    """`logs` of a 2-node task whose rank 1 machine is unreachable: rank 0's output is shown (it was not,
    the error came first) and its read runs to its end (a followed one went on streaming for no one);
    then the machine's error. (The transport fakes what `ssh` says of a machine that is down.)"""
    import asyncio

    from corral.config import PoolEntry
    from corral.errors import ClusterUnreachableError
    from corral.infra.sshpool.pool import SshPoolInfra

    ended: list[str] = []

    class HalfDown:
        async def stream(self, host, script, on_output):
            if host == "lab2":
                raise ClusterUnreachableError("lab2", "connection timed out")
            for line in (b"epoch 1\n", b"epoch 2\n"):
                await asyncio.sleep(0.01)
                on_output(line)
            ended.append(host)
            return 0

    pool = SshPoolInfra(PoolEntry("lab", ("lab1", "lab2"), ()), transport=HalfDown())  # type: ignore[arg-type]
    out: list[bytes] = []
    with pytest.raises(ClusterUnreachableError, match="lab2"):
        asyncio.run(pool._every_rank_output(["lab1", "lab2"], str, follow, out.append))
    assert b"".join(out) == b"0: epoch 1\n0: epoch 2\n" and ended == ["lab1"]


def test_an_allocation_whose_machine_does_not_answer_names_it_once():
    import asyncio

    from corral.config import PoolEntry
    from corral.errors import ClusterUnreachableError
    from corral.infra.base import AllocationPhase
    from corral.infra.sshpool.pool import SshPoolInfra

    class Down:
        async def run(self, host, script, timeout=None, **kw):
            raise ClusterUnreachableError(host, "connection to the machine timed out")

    pool = SshPoolInfra(PoolEntry("lab", ("lab1", "lab2"), ()), transport=Down())  # type: ignore[arg-type]
    [state] = asyncio.run(pool.allocation_states([("lab1,lab2/0123456789ab", "")])).values()
    assert state.phase is AllocationPhase.UNKNOWN
    assert state.reason == "lab1 does not answer (connection to the machine timed out)"


def test_a_checkpoint_sent_from_a_machine_that_fails_is_the_pools_failure_not_the_targets():
    """send_dir from a pool: the machine that has the folder fails mid-way; the error names the pool (the
    source the controller knows), so that the job starts without it rather than failing over."""
    import asyncio

    from corral.config import PoolEntry
    from corral.errors import ClusterError, ClusterUnreachableError
    from corral.infra.base import TakesFolderStreams
    from corral.infra.sshpool.pool import SshPoolInfra

    class Breaks:
        async def run(self, host, script, timeout=None, **kw):
            class Answer:
                stdout = "1700000000\n" if host == "lab2" else "-\n"
            return Answer()

        async def copy_to(self, host, remote_dir, transport, target_host, destination, timeout=600):
            raise ClusterUnreachableError(host, "lost the connection to the machine")

    class Target(TakesFolderStreams):
        def stream_target(self):
            return None, "alpine"

    pool = SshPoolInfra(PoolEntry("lab", ("lab1", "lab2"), ()), transport=Breaks())  # type: ignore[arg-type]
    with pytest.raises(ClusterError) as failed:
        asyncio.run(pool.send_dir(".corral/checkpoints/c-1", Target(), ".corral/checkpoints/c-1/"))
    assert failed.value.cluster == "lab" and "lab2: lost the connection to the machine" in str(failed.value)


def test_a_task_ended_on_one_rank_has_its_ranks_still_running_ended_asked_for_or_found():
    """Found among runs no handle names too: the rank of a task declared failed (MACHINE_DOWN) on a machine
    cut off, once it answers again, its other rank cancelled meanwhile."""
    unnamed, nodes = ranks_of("tok5", {0: "lab1", 1: "lab2"}, 2)
    unnamed[("lab1", "tok5.0")] = status("lab1/tok5.0", "tok5.0", JobState.CANCELLED)
    [task] = _whole_tasks(unnamed, nodes)
    assert task.state is JobState.CANCELLED and _stray_ranks(task, unnamed) == [("lab2", "tok5.1")]
    running, nodes = ranks_of("tok6", {0: "lab1", 1: "lab2"}, 2)
    [task] = _whole_tasks(running, nodes)
    assert _stray_ranks(task, running) == []


class _Transport:
    """Stands in for SshTransport's `run`: each machine's status script answers at once, but for a
    machine held: it waits until released, then fails as unreachable (or, `answers`, answers)."""

    def __init__(self) -> None:
        self.asked: Counter[str] = Counter()
        self.hold: dict[str, asyncio.Event] = {}
        self.answers = False

    async def run(self, host: str, script: str, timeout: float | None = None) -> RemoteResult:
        self.asked[host] += 1
        if host in self.hold:
            await self.hold[host].wait()
            if not self.answers:
                raise ClusterUnreachableError(host, "connection to the machine timed out")
        return RemoteResult(host, 0, "@@corral clock 1\n", "", 0.0)


def test_a_machine_silent_since_an_earlier_pass_is_not_waited_for_nor_asked_twice_at_once(corral_home):
    """A dead machine's connect timeout held up the pool's whole status answer, and a pool whose query
    is overdue is left out of placement: a managed job could not be recovered onto the other machines.
    A wait cut short is no failure: a machine slower than it, which answers, is silent no more."""
    pool = SshPoolInfra(PoolEntry("lab", ("lab1", "lab2")), _Transport())  # type: ignore[arg-type]
    transport = pool.transport

    async def passes(count: int, infra: SshPoolInfra = pool) -> None:
        for _ in range(count):
            started = time.monotonic()
            await infra.status([], others=True)
            assert time.monotonic() - started < 5 * SILENT_WAIT_SECONDS

    async def scenario() -> None:
        transport.hold["lab2"] = asyncio.Event()
        transport.hold["lab2"].set()  # the first pass: lab2 fails at once
        await passes(1)
        transport.hold["lab2"] = asyncio.Event()  # from now on, lab2 hangs until released
        await passes(3)
        assert transport.asked == {"lab1": 4, "lab2": 2}  # one query to lab2 still out, not three
        fresh = SshPoolInfra(PoolEntry("lab", ("lab1", "lab2")), transport)  # type: ignore[arg-type]
        await passes(1, fresh)  # another request's view: the same silence, the same query
        assert transport.asked["lab2"] == 2
        transport.hold.pop("lab2").set()  # it fails: the next pass sees that failure, and asks nothing
        await passes(1)
        assert transport.asked["lab2"] == 2 and "lab2" in pool._machines.silent_since
        transport.hold["lab2"], transport.answers = asyncio.Event(), True  # slow, but it answers
        await passes(1)
        assert transport.asked["lab2"] == 3 and "lab2" in pool._machines.silent_since
        transport.hold.pop("lab2").set()
        for _ in range(5):  # the query's step, then its done callback
            await asyncio.sleep(0)
        assert "lab2" not in pool._machines.silent_since  # no pass waited for it: its answer ends the silence
        await passes(1)
        assert transport.asked["lab2"] == 4

    asyncio.run(asyncio.wait_for(scenario(), 30))  # before: the second pass waited for lab2 for ever
