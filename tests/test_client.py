"""The client's probes: placement under a spent budget answers from the latest recent snapshot instead
of waiting for a slot; `max_age` callers share the latest probe; everything else probes afresh."""

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


def counting_client(cluster: str) -> tuple[Client, CountingInfra]:
    fake = CountingInfra(cluster, SNAPSHOTS["alpine"])
    probing = Client.__new__(Client)
    probing.registry = SimpleNamespace(path="fake", select=lambda names: [SimpleNamespace(name=cluster)])
    probing.infra = lambda name, owner="": fake
    probing.transport = SimpleNamespace(timeout=5.0)
    return probing, fake


def test_placement_reuses_a_recent_probe_only_when_the_budget_cannot_afford_a_fresh_one(monkeypatch):
    cluster = "reuse-test"
    probing, _ = counting_client(cluster)
    allowance = budget._BUDGETS[cluster] = budget.Budget(8)

    def probe(**flags):
        [outcome] = asyncio.run(probing.probe([cluster], **flags))
        return outcome

    CountingInfra.probes = 0
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
    monkeypatch.setitem(client._LATEST, ("fake", "gone", (False, ("/old",), ())), (-1e9, -1e9, first))
    probe()
    assert ("fake", "gone", (False, ("/old",), ())) not in client._LATEST  # aged-out snapshots are dropped
    del budget._BUDGETS[cluster]


def test_max_age_callers_share_the_latest_probe_and_renew_it_past_half_its_age(monkeypatch):
    cluster = "shared-test"
    probing, fake = counting_client(cluster)
    key = ("fake", cluster, (False, (), ()))
    clock = [1000.0]
    monkeypatch.setattr(client, "monotonic", lambda: clock[0])  # the client's clock only, not the event loop's

    async def gpus(max_age: float):
        report = await probing.gpus(max_age=max_age)
        await asyncio.sleep(0)  # let a probe started behind the answer run
        await asyncio.sleep(0)
        return report

    CountingInfra.probes = 0
    first = asyncio.run(gpus(10))
    assert CountingInfra.probes == 1 and first.rows  # nothing kept yet: probed
    clock[0] += 4
    assert asyncio.run(gpus(10)).outcomes == first.outcomes and CountingInfra.probes == 1  # shared, young
    clock[0] += 2  # 6 s old: answered from it, and renewed behind the answer
    assert asyncio.run(gpus(10)).outcomes == first.outcomes and CountingInfra.probes == 2
    assert client._LATEST[key][0] == 1006.0
    assert asyncio.run(gpus(0)).outcomes != first.outcomes and CountingInfra.probes == 3  # 0: probe now
    fake.unreachable = True
    clock[0] += 11  # too old for max_age 10: probed, and the failure is what the next caller gets
    down = asyncio.run(gpus(10))
    assert CountingInfra.probes == 4 and [f.cluster for f in down.failures] == [cluster] and not down.rows
    fake.unreachable = False
    clock[0] += 1
    assert asyncio.run(gpus(10)).failures == down.failures and CountingInfra.probes == 4
