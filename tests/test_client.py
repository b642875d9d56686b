"""The client's probes: placement under a spent budget answers from the latest recent snapshot instead
of waiting for a slot; everything else probes afresh."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from corral import budget, client
from corral.client import Client
from tests.fakes import FakeInfra
from tests.test_placement import SNAPSHOTS


class CountingInfra(FakeInfra):
    probes = 0

    async def probe(self, **asked):
        CountingInfra.probes += 1
        return await super().probe(**asked)


def test_placement_reuses_a_recent_probe_only_when_the_budget_cannot_afford_a_fresh_one(monkeypatch):
    cluster = "reuse-test"
    fake = CountingInfra(cluster, SNAPSHOTS["alpine"])
    probing = Client.__new__(Client)
    probing.registry = SimpleNamespace(path="fake", select=lambda names: [SimpleNamespace(name=cluster)])
    probing.infra = lambda name, owner="": fake
    probing.transport = SimpleNamespace(timeout=5.0)
    allowance = budget._BUDGETS[cluster] = budget.Budget(8)

    def probe(**flags):
        [outcome] = asyncio.run(probing.probe([cluster], **flags))
        return outcome

    first = probe(reuse_when_busy=True)
    assert CountingInfra.probes == 1 and first.ok
    assert probe(reuse_when_busy=True) is not first and CountingInfra.probes == 2  # the budget can pay: fresh
    allowance.spend(8)  # the minute's budget spent
    reused = probe(reuse_when_busy=True)
    assert CountingInfra.probes == 2 and reused.at >= first.at  # answered from the latest snapshot
    assert probe() is not reused and CountingInfra.probes == 3  # gpus and check always probe
    monkeypatch.setattr(client, "RECENT_PROBE_MAX_AGE", 0.0)
    assert probe(reuse_when_busy=True) and CountingInfra.probes == 4  # too old: fresh (and waits, in real use)
    monkeypatch.setattr(client, "RECENT_PROBES_KEPT", 0)
    monkeypatch.setitem(client._RECENT, ("fake", "gone", (False, ("/old",), ())), (-1e9, first))
    probe()
    assert ("fake", "gone", (False, ("/old",), ())) not in client._RECENT  # aged-out snapshots are dropped
    del budget._BUDGETS[cluster]
