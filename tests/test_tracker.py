"""The tracker under load: a cluster whose RPC budget cannot afford a status query at once is left as
last seen, for a bounded time, instead of every `queue` waiting for its slot."""

from __future__ import annotations

import asyncio

from corral import budget, tracker
from corral.state import Store
from corral.tracker import Tracker
from tests.fakes import FakeInfra
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
