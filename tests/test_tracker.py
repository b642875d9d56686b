"""The tracker under load: a cluster whose RPC budget cannot afford a status query at once is left as
last seen, for a bounded time, instead of every `queue` waiting for its slot."""

from __future__ import annotations

import asyncio

from corral import budget, tracker
from corral.state import Store
from corral.tracker import Tracker
from corral.infra.base import JobState
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

    async def refresh(self, scope=None):
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
