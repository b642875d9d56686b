"""Submissions to one machine sent together (submissions.py): the combined script, told apart again, and
the batching itself over a stand-in for the transport (the real machines: tests/cli/test_pools.py)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from corral.errors import ClusterError, RemoteCommandError
from corral.infra.sshpool.submissions import BATCH, CacheSync, MachineSubmissions, answers, combined


def test_each_script_runs_in_its_own_subshell_and_its_answer_comes_back_apart():
    scripts = ["echo one; exit 0; echo never", "set -u; echo two; exit 3", "read -r line; echo \"read:${line:-}\"",
               "printf 'no newline'", "mkdir /proc/x"]
    ran = subprocess.run(["bash", "-s"], input=combined(scripts) + "echo after\n", capture_output=True, text=True,
                         check=True)
    assert answers(ran.stdout, 5)[:4] == [(0, "one"), (3, "two"), (0, "read:"), (0, "no newline")]
    status, said = answers(ran.stdout, 5)[4]
    assert status == 1 and "mkdir: cannot create directory" in said  # stderr too: what a failure says
    assert ran.stdout.endswith("after\n")  # the session went on: an exit ends its subshell only


def test_a_session_that_ends_early_leaves_the_rest_unanswered():
    ran = subprocess.run(["bash", "-s"], input=combined(["echo one", "kill -9 $$", "echo three"]),
                         capture_output=True, text=True)
    assert answers(ran.stdout, 3) == [(0, "one"), None, None]


class Machine:
    """Records what reached it: each round trip's scripts and each sync."""

    def __init__(self, fail: str = ""):
        self.round_trips: list[int] = []
        self.syncs: list[str] = []
        self.fail = fail

    async def run(self, script: str, timeout: float) -> str:
        await asyncio.sleep(0)  # the session is on its way: others arrive meanwhile
        if self.fail:
            raise ClusterError("m1", self.fail)
        self.round_trips.append(script.count("@@corral-part-end"))
        ran = await asyncio.create_subprocess_exec("bash", "-s", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        out, _ = await ran.communicate(script.encode())
        return out.decode()

    async def sync(self, cache: CacheSync) -> None:
        self.syncs.append(cache.local.name)


def test_what_arrives_together_goes_in_one_round_trip_per_batch_and_a_lone_one_at_once():
    machine = Machine()

    async def main() -> list[str]:
        submissions = MachineSubmissions("m1", machine.run, machine.sync, 30)
        lone = await submissions.submit("echo alone")
        many = await asyncio.gather(*(submissions.submit(f"echo {i}") for i in range(BATCH * 2 + 3)))
        return [lone, *many]

    outputs = asyncio.run(main())
    assert outputs == ["alone", *(str(i) for i in range(BATCH * 2 + 3))]
    assert machine.round_trips == [1, BATCH, BATCH, 3]


def test_a_workdir_is_synced_once_for_the_scripts_that_read_it_and_again_for_another():
    machine = Machine()
    first = CacheSync(Path("/uploads/a/tree"), "0123456789abcdef")
    second = CacheSync(Path("/uploads/b"), "0123456789abcdef")

    async def main() -> None:
        submissions = MachineSubmissions("m1", machine.run, machine.sync, 30)
        await asyncio.gather(*(submissions.submit("true", first) for _ in range(10)),
                             *(submissions.submit("true", second) for _ in range(5)),
                             *(submissions.submit("true", first) for _ in range(2)))
        await submissions.submit("true", first)  # a later launch: synced again (another may have written it)

    asyncio.run(main())
    assert machine.syncs == ["tree", "b", "tree", "tree"]
    assert machine.round_trips == [10, 5, 2, 1]  # a batch never mixes two contents of one cache


def test_every_submitter_hears_of_a_failed_session_or_script():
    async def main(machine: Machine, script: str) -> list[BaseException | str]:
        submissions = MachineSubmissions("m1", machine.run, machine.sync, 30)
        return await asyncio.gather(*(submissions.submit(script) for _ in range(3)), return_exceptions=True)

    down = asyncio.run(main(Machine(fail="connection refused"), "true"))
    assert all(isinstance(e, ClusterError) and "connection refused" in str(e) for e in down)
    failed = asyncio.run(main(Machine(), "echo partial; exit 7"))
    assert all(isinstance(e, RemoteCommandError) and e.exit_status == 7 and "partial" in str(e) for e in failed)


def test_a_submitter_that_has_gone_starts_nothing():
    machine = Machine()

    async def main() -> str:
        submissions = MachineSubmissions("m1", machine.run, machine.sync, 30)
        gone = asyncio.ensure_future(submissions.submit("echo gone"))
        kept = asyncio.ensure_future(submissions.submit("echo kept"))
        await asyncio.sleep(0)  # both queued
        gone.cancel()
        return await kept

    assert asyncio.run(main()) == "kept"
    assert machine.round_trips == [1]


@pytest.mark.parametrize("noise", ["@@corral-part-end x 0", "text @@corral-part-end 0 0", "@@corral-part-end 0 0 0"])
def test_a_line_that_only_looks_like_an_end_is_output(noise):
    assert answers(f"{noise}\n@@corral-part-end 0 0\n", 1) == [(0, noise)]


def test_an_end_for_a_script_not_sent_is_ignored():
    assert answers("@@corral-part-end 99 0\n", 1) == [None]
