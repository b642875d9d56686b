"""The tracker under load: a cluster whose RPC budget cannot afford a status query at once is left as
last seen, for a bounded time, instead of every `queue` waiting for its slot."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time

from corral import budget, tracker
from corral.state import Store
from corral.tracker import Tracker
from corral.infra.base import FailureClass, JobState
from tests.fakes import FakeInfra, status
from tests.test_seam import fakes, launch


class CountingInfra(FakeInfra):
    async def status(self, handles, accounts=(), *, others=True):
        self.queried = getattr(self, "queried", 0) + 1
        return await super().status(handles, accounts)


def test_a_short_budget_defers_a_cluster_s_refresh_for_a_bounded_time(tmp_path, monkeypatch):
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    client = fakes(kind=CountingInfra)
    [share] = launch(client, store, {"resources": {"accelerators": "B300:8"}, "run": "true"})
    cirrus = client.infras["cirrus"]
    monkeypatch.setattr(tracker, "_LAST_REFRESHED", {})
    monkeypatch.setitem(budget._BUDGETS, "cirrus", budget.Budget(8))
    budget._BUDGETS["cirrus"].spend(8)  # its minute spent

    def refresh():
        return asyncio.run(Tracker(client, store).refresh())

    assert refresh().deferred == [] and cirrus.queried == 1  # never refreshed yet: it waits for its slot
    assert refresh().deferred == ["cirrus"] and cirrus.queried == 1  # refreshed just now: left as last seen
    monkeypatch.setattr(tracker, "REFRESH_DEFER_SECONDS", 0.0)
    assert refresh().deferred == [] and cirrus.queried == 2  # too long since: refreshed, slot or not
    assert share.cluster == "cirrus"


class GatedTracker:
    """A tracker whose refresh runs until the test opens its gate; counts the refreshes started."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.started = 0

    async def refresh(self, scope=None, patience=None, skip_failing=False):
        self.started += 1
        await self.gate.wait()
        return tracker.RefreshReport({}, {})


def test_a_caller_that_accepts_a_recent_refresh_does_not_wait_for_a_running_one():
    async def scenario() -> None:
        shared = tracker.SharedRefresh(max_age=0.0)
        gated = GatedTracker()
        gated.gate.set()
        first = await shared.refresh(gated)  # finished just now
        gated.gate.clear()
        running = asyncio.ensure_future(shared.refresh(gated))  # the next one (a tick's) runs, gated
        for _ in range(3):
            await asyncio.sleep(0)
        assert gated.started == 2 and not running.done()
        # The API's request: the last one finished within 5 s, so it answers from it at once...
        assert await asyncio.wait_for(shared.refresh(gated, fresh_within=5.0), timeout=1) is first
        # ...whereas a caller that needs a fresh one shares the running one.
        waiting = asyncio.ensure_future(shared.refresh(gated))
        for _ in range(3):
            await asyncio.sleep(0)
        assert not waiting.done() and gated.started == 2
        gated.gate.set()
        assert await waiting is await running is not first

    asyncio.run(scenario())


class SlowInfra(FakeInfra):
    """Answers a status query only once the test opens its gate (a login node whose squeue hangs)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate = asyncio.Event()

    async def status(self, handles, accounts=(), *, others=True):
        await self.gate.wait()
        return await super().status(handles, accounts)


def test_a_request_waits_for_a_slow_cluster_only_so_long_and_sees_the_others_fresh(tmp_path):
    """With alpine's slurmctld stopped, its squeue failed after 4 s (8 s with the refresh's two commands)
    and every `corral queue` that shared that refresh waited for it, borealis's news included."""
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    client = fakes(kind=SlowInfra)
    [on_alpine] = launch(client, store, {"resources": {"accelerators": "H100:2"}, "run": "true"})
    [on_cirrus] = launch(client, store, {"resources": {"accelerators": "B300:8"}, "run": "true"})
    assert (on_alpine.cluster, on_cirrus.cluster) == ("alpine", "cirrus")
    client.infras["alpine"].gate.set()
    cirrus = client.infras["cirrus"]
    for infra, share in ((client.infras["alpine"], on_alpine), (cirrus, on_cirrus)):
        infra.jobs[share.handle] = status(share.handle, infra.jobs[share.handle].token, JobState.RUNNING)

    def state_of(share) -> str:
        return store.attempts_of(share.job_ids)[share.job_ids[0]][-1].state

    async def scenario() -> None:
        shared = tracker.SharedRefresh(max_age=0.0)
        report = await shared.refresh(Tracker(client, store), at_most=0.2)
        assert list(report.errors) == ["cirrus"] and report.errors["cirrus"].startswith("no answer in 0.")
        assert report.errors["cirrus"].endswith(" s; its jobs are shown as last seen (Corral keeps asking)")
        assert state_of(on_alpine) == "RUNNING" and state_of(on_cirrus) == "PENDING"  # alpine's answer is written
        # A request that joins the refresh once it has run that long does not wait for cirrus again.
        again = await asyncio.wait_for(shared.refresh(Tracker(client, store), at_most=0.2), timeout=0.1)
        assert list(again.errors) == ["cirrus"]
        ticking = asyncio.ensure_future(shared.refresh(Tracker(client, store)))  # the tick's: it waits, sharing
        for _ in range(3):
            await asyncio.sleep(0)
        assert not ticking.done()
        cirrus.gate.set()
        whole = await asyncio.wait_for(ticking, timeout=5)
        assert whole.errors == {} and state_of(on_cirrus) == "RUNNING"
        # That refresh ended in the background; a request now starts the next and has it all at once.
        assert (await shared.refresh(Tracker(client, store), at_most=0.2)).errors == {}

    asyncio.run(scenario())


class CountingSlowInfra(SlowInfra):
    async def status(self, handles, accounts=(), *, others=True):
        self.queried = getattr(self, "queried", 0) + 1
        return await super().status(handles, accounts)


async def until(condition, timeout: float = 5.0) -> None:
    """Let the event loop run until `condition()` holds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_a_refresh_newer_than_one_held_up_asks_the_others_again_and_joins_the_slow_query(tmp_path):
    """A slurmctld slow but alive (squeue up to its 30 s timeout) held up the whole refresh: the next
    tick joined it, and no other cluster was asked again until the slow one answered."""
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    client = fakes(kind=CountingSlowInfra)
    [on_alpine] = launch(client, store, {"resources": {"accelerators": "H100:2"}, "run": "true"})
    [on_cirrus] = launch(client, store, {"resources": {"accelerators": "B300:8"}, "run": "true"})
    alpine, cirrus = client.infras["alpine"], client.infras["cirrus"]
    alpine.gate.set()

    def state_of(share) -> str:
        return store.attempts_of(share.job_ids)[share.job_ids[0]][-1].state

    async def scenario() -> None:
        shared = tracker.SharedRefresh(max_age=0.0)
        first = await shared.refresh(Tracker(client, store), at_most=0.1)
        assert first.waiting == ["cirrus"] and list(first.errors) == ["cirrus"]
        assert (alpine.queried, cirrus.queried) == (1, 1)
        alpine.finish(on_alpine.handle, JobState.RUNNING)
        # The next tick wants news newer than the first refresh: alpine is asked again, cirrus is not.
        second = await shared.refresh(Tracker(client, store), newer_than=time.monotonic(), at_most=0.1)
        assert second.waiting == ["cirrus"] and state_of(on_alpine) == "RUNNING"
        assert (alpine.queried, cirrus.queried) == (2, 1) and shared.flights.running() == {"cirrus"}
        # Nor is cirrus' query, already older than a caller's patience, waited for again: the refresh ends
        # with alpine's answer (it would wait for ever for cirrus' gate).
        await until(lambda: "cirrus" in shared.flights.overdue(0.2))  # unrounded, as `patience` is compared
        third = await asyncio.wait_for(Tracker(client, store, shared.flights).refresh(patience=0.2), timeout=5)
        assert third.waiting == ["cirrus"]
        assert re.fullmatch(r"no answer in 0\.\d+ s; its jobs are shown as last seen \(Corral keeps asking\)",
                            third.errors["cirrus"])
        assert (alpine.queried, cirrus.queried) == (3, 1)
        cirrus.finish(on_cirrus.handle, JobState.RUNNING)
        cirrus.gate.set()  # the slow answer comes, and is written though no caller waits for it
        await until(lambda: state_of(on_cirrus) == "RUNNING")
        assert shared.flights.running() == set() and cirrus.queried == 1

    asyncio.run(scenario())


def test_a_cluster_that_failed_when_last_asked_is_failing_while_asked_again_not_slow(tmp_path):
    """A frozen slurmctld: squeue fails after seconds, and the next query (ping first) takes seconds
    too. A caller that stops waiting must see a failing cluster, not a slow one, or the controller's
    grace clock would never start."""
    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    client = fakes(kind=CountingSlowInfra)
    launch(client, store, {"resources": {"accelerators": "B300:8"}, "run": "true"})
    cirrus = client.infras["cirrus"]
    cirrus.unreachable = True

    async def scenario() -> None:
        shared = tracker.SharedRefresh(max_age=0.0)
        assert (await shared.refresh(Tracker(client, store), at_most=0.1)).waiting == ["cirrus"]  # nothing known
        cirrus.gate.set()
        await until(lambda: not shared.flights.running())  # it failed, in the background
        cirrus.gate.clear()
        # Failing when last asked: an API request does not wait for it again, however patient (30 s).
        again = await asyncio.wait_for(shared.refresh(Tracker(client, store), at_most=30, skip_failing=True),
                                       timeout=5)
        assert again.waiting == [] and cirrus.queried == 2
        assert again.errors["cirrus"].startswith("login node refused the connection (fake)")  # no "cirrus: "
        assert re.search(r"\(asked again: no answer in [\d.]+ s yet\)$", again.errors["cirrus"])

    asyncio.run(scenario())


class DeclaringInfra(FakeInfra):
    """Corral is its scheduler, as for an SSH pool: what it declares failed must not run on."""

    ends_what_it_declared_failed = True


def test_a_task_declared_failed_found_running_again_is_ended_where_corral_schedules_alone(tmp_path):
    """A pool's machine cut off: its task is declared failed (MACHINE_DOWN), runs on there, and is
    found running once the machine answers again, with no live job left to query the pool for. On
    Slurm such a job (one Slurm requeued) is Slurm's business."""
    for kind, ended in ((DeclaringInfra, True), (FakeInfra, False)):
        store = Store(f"sqlite:///{tmp_path / f'{kind.__name__}.db'}")
        client = fakes(kind=kind)
        [share] = launch(client, store, {"resources": {"accelerators": "B300:8"}, "run": "sleep 600"})
        cirrus = client.infras["cirrus"]
        cirrus.jobs[share.handle] = dataclasses.replace(cirrus.jobs[share.handle], state=JobState.RUNNING,
                                                        started_at=1000.0)
        asyncio.run(Tracker(client, store).refresh())
        cirrus.finish(share.handle, JobState.FAILED, FailureClass.INFRA, native="MACHINE_DOWN", ended_at=time.time())
        asyncio.run(Tracker(client, store).refresh())
        [attempt] = store.attempts_of([share.job_ids[0]])[share.job_ids[0]]
        assert (attempt.state, attempt.failure, attempt.started_at) == ("FAILED", "infra", 1000.0)  # its start kept
        cirrus.jobs[share.handle] = status(share.handle, attempt.token, JobState.RUNNING)  # it answers again
        report = asyncio.run(Tracker(client, store).refresh())
        assert (report.reaped.get("cirrus") == [share.handle], cirrus.cancelled == [share.handle]) == (ended, ended)
        [attempt] = store.attempts_of([share.job_ids[0]])[share.job_ids[0]]
        assert attempt.state == "FAILED" and ("running on its own: cancelled it there" in attempt.reason) == ended
