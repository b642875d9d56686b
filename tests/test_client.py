"""The client's probes: placement under a spent budget answers from the latest recent snapshot instead
of waiting for a slot; `max_age` callers share the latest probe; everything else probes afresh."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from corral import budget, client
from corral.client import Client
from corral.errors import ClusterUnreachableError
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


class GatedInfra(FakeInfra):
    """A probe that fails after the test's clock says it took 5 s (a frozen slurmctld's ping), or waits
    for the test's gate."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate: asyncio.Event | None = None
        self.probes = 0

    async def probe(self, **asked):
        self.probes += 1
        if self.gate is not None:
            await self.gate.wait()
        return await super().probe(**asked)


def test_a_cluster_whose_last_probe_failed_slowly_is_waited_for_a_second_then_reported_as_asked_again(monkeypatch):
    """A frozen slurmctld: each probe's `scontrol ping` gave up after 5 s, and every launch and `gpus`
    waited those 5 s again for as long as it stayed frozen."""
    cluster = "frozen-test"
    fake = GatedInfra(cluster, SNAPSHOTS["alpine"], unreachable=True)
    probing = Client.__new__(Client)
    probing.registry = SimpleNamespace(path="fake", select=lambda names: [SimpleNamespace(name=cluster)])
    probing.infra = lambda name, owner="": fake
    probing.transport = SimpleNamespace(timeout=5.0)
    clock = [1000.0]
    monkeypatch.setattr(client, "monotonic", lambda: clock[0])
    monkeypatch.setattr(client, "FAILING_PATIENCE", 0.05)

    async def scenario() -> None:
        async def slow_probe(**asked):  # fails, 5 s later by the client's clock
            fake.probes += 1
            clock[0] += 5
            raise ClusterUnreachableError(cluster, "no answer within 5s (fake)")

        monkeypatch.setattr(fake, "probe", slow_probe)
        [first] = await probing.probe()
        assert first.error_kind == "unreachable" and first.seconds == 5
        monkeypatch.setattr(fake, "probe", GatedInfra.probe.__get__(fake))  # the next probe hangs on the gate
        fake.gate = asyncio.Event()
        [again] = await asyncio.wait_for(probing.probe(), timeout=5)  # without the rule: for ever
        assert again.error_kind == "unreachable" and fake.probes == 2  # asked again, all the same
        assert str(again.error) == f"{cluster}: no answer within 5s (fake) (asked again: no answer in 0.05 s yet)"
        fake.unreachable = False
        fake.gate.set()  # the cluster answers: the probe behind the answer lands, and the next caller waits again
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert (str(probing.registry.path), cluster) not in client._FAILING_SLOWLY
        fake.gate = asyncio.Event()
        waiting = asyncio.ensure_future(probing.probe())
        await asyncio.sleep(0.2)
        assert not waiting.done()  # patient again: 0.2 s > FAILING_PATIENCE
        fake.gate.set()
        [answered] = await waiting
        assert answered.ok

    asyncio.run(scenario())


def test_a_cluster_left_out_is_not_asked_and_says_why():
    probing, _ = counting_client("left-out-test")
    CountingInfra.probes = 0
    [outcome] = asyncio.run(probing.probe(["left-out-test"], leave_out={"left-out-test": "slow, says the tick"}))
    assert CountingInfra.probes == 0 and outcome.snapshot is None
    assert isinstance(outcome.error, client.LeftOut) and outcome.error_message == "left-out-test: slow, says the tick"
    [asked] = asyncio.run(probing.probe(["left-out-test"], leave_out={"another": "slow"}))
    assert CountingInfra.probes == 1 and asked.ok


def test_gpus_of_one_kind_asks_only_its_places_and_says_what_to_set_up_when_there_is_none(tmp_path, monkeypatch):
    """`corral gpus --infra k8s` without contexts had probed every Slurm cluster, then shown none."""
    import pytest

    from corral.errors import NotFoundError

    cluster_file = tmp_path / "clusters"
    cluster_file.write_text("Host alpine\n  HostName 127.0.0.1\n  Port 1\n")
    monkeypatch.setenv("CORRAL_SLURM_CONFIG", str(cluster_file))
    monkeypatch.setenv("CORRAL_HOME", str(tmp_path / "home"))
    asked = []
    probing = Client()

    async def probe(clusters=None, **flags):
        asked.append(clusters)
        return []

    monkeypatch.setattr(probing, "probe", probe)
    with pytest.raises(NotFoundError, match=r"^infra k8s: no Kubernetes context is set up: list contexts under"):
        asyncio.run(probing.gpus(infra="k8s"))
    with pytest.raises(NotFoundError, match=r"^infra ssh: no SSH pool is set up"):
        asyncio.run(probing.gpus(infra="ssh"))
    asyncio.run(probing.gpus(infra="slurm"))
    assert asked == [["alpine"]]
