"""SlurmInfra on the testbed: the light status query (`squeue --only-job-state`) where the site has it.

Debian 12's Slurm (22.05) has no `--only-job-state`; `Testbed.light_squeue` gives one login node a
squeue that takes it and answers ids and states from the real queue, and logs each call as `light`
or `full`. So what Corral does with the answers runs against real jobs; the light RPC itself does not.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import time

import pytest

from corral import budget
from corral.client import Client
from corral.errors import SlurmControllerError
from corral.infra.slurm.probe import parse_probe_output, probe_script
from corral.launch import Launcher
from corral.state import open_store
from corral.task import parse_task
from corral.tracker import SharedRefresh, Tracker, left_out


@pytest.fixture
def light_cirrus(testbed):
    log = testbed.light_squeue("cirrus")
    yield log
    testbed.light_squeue("cirrus", on=False)


def calls(log) -> list[str]:
    """Each squeue call's kind (`light`, `full`), in order."""
    return [line.split()[0] for line in log.read_text().splitlines() if line.strip()]


def spent_since(cluster: str, since: float) -> int:
    """The Slurm commands the cluster's budget counts for round trips since `since` (monotonic)."""
    return sum(commands for when, commands in budget.budget_for(cluster).spent if when >= since)


def test_a_refresh_where_nothing_changed_is_the_light_query_alone(corral_env, testbed, light_cirrus, clean_queues):
    store = open_store()
    task = parse_task({"resources": {"cpus": 1, "infra": "slurm/cirrus"}, "run": "sleep 300"}, "test")

    async def scenario() -> None:
        client = Client()
        await Launcher(client, store).launch(task, "test")
        [attempt] = store.active_attempts()
        tracker = Tracker(client, store)
        deadline = time.monotonic() + 60
        while store.attempts_by_token([attempt.token])[0].state != "RUNNING":
            assert time.monotonic() < deadline, "the job did not start"
            await tracker.refresh()
            await asyncio.sleep(0.5)
        await tracker.refresh()  # the full query that saw it RUNNING, with the light digest to compare to

        # Nothing changes: each refresh is one round trip whose script stops after the light query, and
        # it is charged one command, the two it did not run (squeue's full query, sacct) given back.
        light_cirrus.write_text("")
        since = time.monotonic()
        for _ in range(3):
            report = await tracker.refresh()
            assert report.round_trips == {"cirrus": 1}
        assert calls(light_cirrus) == ["light"] * 3
        assert spent_since("cirrus", since) == 3
        assert store.attempts_by_token([attempt.token])[0].state == "RUNNING"

        # Its state changes outside Corral: the light query sees it, and the full one runs in the same
        # round trip, so the change is recorded at the next refresh, as without the light query.
        await asyncio.to_thread(subprocess.run, ["ssh", "-F", str(testbed.cluster_config), "cirrus",
                                                 f"scancel {attempt.handle}"], check=True, capture_output=True)
        light_cirrus.write_text("")
        deadline = time.monotonic() + 30
        while store.attempts_by_token([attempt.token])[0].state != "CANCELLED":
            assert time.monotonic() < deadline, "the cancel was not seen"
            await tracker.refresh()
        assert calls(light_cirrus)[:2] == ["light", "full"]

    asyncio.run(scenario())


def test_a_squeue_without_the_option_is_asked_once(corral_env, testbed, clean_queues):
    """Every testbed cluster's own squeue (22.05): the first refresh finds the option unknown, and the
    refreshes after it are the full query alone, charged two commands (squeue, sacct) as before."""
    store = open_store()
    task = parse_task({"resources": {"cpus": 1, "infra": "slurm/alpine"}, "run": "sleep 300"}, "test")

    async def scenario() -> None:
        client = Client()
        await Launcher(client, store).launch(task, "test")
        tracker = Tracker(client, store)
        infra = client.infra("alpine")
        await tracker.refresh()
        assert infra._status_lines.light is False
        since = time.monotonic()
        report = await tracker.refresh()
        assert report.round_trips == {"alpine": 1}
        assert spent_since("alpine", since) == infra.status_commands

        # After a query that failed, the next pings first: the controller is UP, so the query goes on,
        # charged the ping too, and the one after it does not ping.
        infra._status_lines.failed = True
        since = time.monotonic()
        assert (await tracker.refresh()).errors == {}
        assert spent_since("alpine", since) == infra.status_commands + 1 and not infra._status_lines.failed

    asyncio.run(scenario())


def test_after_a_failed_status_query_a_stopped_controller_is_found_by_one_ping(corral_env, controller_stopped):
    """Against a stopped slurmctld, squeue retries for 8 s before it gives up; after that first failure,
    each status query asks `scontrol ping` first, which says DOWN at once, and goes no further."""

    async def scenario() -> None:
        infra = Client().infra(controller_stopped)
        infra._status_lines.failed = True  # as the query that met the stopped controller left it
        for _ in range(2):
            since = time.monotonic()
            with pytest.raises(SlurmControllerError, match=r"does not answer: scontrol ping: .* is DOWN"):
                await infra.status(["1"])
            assert spent_since(controller_stopped, since) == 1  # the ping alone; squeue and sacct given back
        assert infra._status_lines.failed

    asyncio.run(scenario())


def test_a_frozen_controller_holds_up_only_its_own_cluster_and_is_not_asked_twice(corral_env, testbed, clean_queues):
    """cirrus' slurmctld alive but silent (SIGSTOP): its squeue takes ~10 s to fail. A caller waits 1 s
    and has alpine's answer; the next refresh asks alpine again and joins cirrus' query in flight, so
    cirrus is sent no second command while the first is unanswered."""
    store = open_store()

    async def scenario() -> None:
        client = Client()
        launcher = Launcher(client, store)
        for cluster in ("alpine", "cirrus"):
            task = parse_task({"resources": {"cpus": 1, "infra": f"slurm/{cluster}"}, "run": "sleep 300"}, "test")
            await launcher.launch(task, "test")
        shared = SharedRefresh(max_age=0.0)
        assert (await shared.refresh(Tracker(client, store))).errors == {}
        testbed.freeze_controller("cirrus")
        try:
            since = time.monotonic()
            first = await shared.refresh(Tracker(client, store), at_most=1.0)
            assert time.monotonic() - since < 3.0
            assert first.waiting == ["cirrus"] and re.match(r"no answer in 1(\.\d)? s;", first.errors["cirrus"])
            asked = spent_since("alpine", since)
            again = time.monotonic()
            second = await shared.refresh(Tracker(client, store), newer_than=again, at_most=1.0)
            assert second.waiting == ["cirrus"] and time.monotonic() - again < 3.0
            assert spent_since("alpine", again) == asked > 0  # alpine asked again, as much
            assert spent_since("cirrus", again) == 0 and shared.flights.running() == {"cirrus"}
            # A launch that may run anywhere leaves cirrus out while its status query is overdue (the
            # server's API does so): its probe would have waited for `scontrol ping` to give up, 5 s.
            slow = left_out(shared.flights.overdue(1.0))
            assert list(slow) == ["cirrus"]
            anywhere = parse_task({"resources": {"cpus": 1}, "run": "true"}, "test")
            [share] = await Launcher(client, store, slow=slow).launch(anywhere, "test")
            assert share.cluster != "cirrus" and spent_since("cirrus", again) == 0
        finally:
            testbed.thaw_controller("cirrus")
        deadline = time.monotonic() + 30
        while shared.flights.running():  # the first query ends once cirrus' controller answers (or gives up)
            assert time.monotonic() < deadline, "cirrus' query never ended"
            await asyncio.sleep(0.1)

    asyncio.run(scenario())


def test_a_probe_whose_tmpdir_does_not_exist_uses_tmp(testbed):
    """A login environment whose TMPDIR is gone (or full): the probe's scratch folder falls back to /tmp
    (then the home folder) instead of failing with no reason given."""
    script = probe_script(5)
    run = subprocess.run(["ssh", "-F", str(testbed.cluster_config), "-o", "BatchMode=yes", "alpine",
                          "TMPDIR=/nonexistent bash -s"], input=script, capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    snapshot = parse_probe_output("alpine", run.stdout, 5)
    assert [p.name for p in snapshot.partitions] == ["gpu", "cpu", "inference"] and len(snapshot.nodes) == 4
