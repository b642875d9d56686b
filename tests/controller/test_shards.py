"""Replicas on one store share the clusters: fair shares, no cluster held twice, a dead replica's
clusters handed over once their leases lapse, and every managed job driven by one replica only."""

from __future__ import annotations

import asyncio

import pytest

from corral.controller.shards import Shards, cluster_list_note, fair_share, home_cluster, rebalance
from corral.state import Store
from tests.helpers import ManualClock

CLUSTERS = [f"c{i}" for i in range(7)]


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(f"sqlite:///{tmp_path / 'state.db'}")



def test_a_fair_share_is_the_clusters_over_the_replicas_rounded_up():
    assert [fair_share(7, r) for r in (1, 2, 3, 7, 9)] == [7, 4, 3, 1, 1]
    assert fair_share(7, 0) == 7


def test_rebalance_takes_free_clusters_up_to_the_share_and_gives_up_the_rest():
    # Alone: everything free is taken.
    plan = rebalance("a", CLUSTERS, {}, replicas=1)
    assert sorted(plan.take) == CLUSTERS and plan.release == []
    # A second replica arrived: the first gives up what is beyond its share (4 of 7)...
    plan = rebalance("a", CLUSTERS, dict.fromkeys(CLUSTERS, "a"), replicas=2)
    assert plan.take == [] and len(plan.release) == 3
    # ...and the second takes only what nobody holds.
    held_by_a = {c: "a" for c in CLUSTERS if c not in plan.release}
    plan = rebalance("b", CLUSTERS, held_by_a, replicas=2)
    assert set(plan.take) == set(plan.take) - set(held_by_a) and len(plan.take) == 3
    # Seven over three: one replica holds three, the others two each.
    holders = {"c0": "a", "c1": "a", "c2": "a", "c3": "b", "c4": "b"}
    assert len(rebalance("c", CLUSTERS, holders, replicas=3).take) == 2
    holders = {"c0": "a", "c1": "a", "c3": "b", "c4": "b"}
    assert len(rebalance("c", CLUSTERS, holders, replicas=3).take) == 3
    # A cluster gone from the clusters file is given up.
    assert rebalance("a", CLUSTERS, {"gone": "a"}, replicas=1).release == ["gone"]


def test_a_job_is_homed_on_its_latest_attempts_cluster_else_by_its_id():
    assert home_cluster("job1", "c3", CLUSTERS) == "c3"
    first = home_cluster("job1", None, CLUSTERS)
    assert first in CLUSTERS and home_cluster("job1", "removed", CLUSTERS) == first  # the same everywhere
    assert len({home_cluster(f"job{i}", None, CLUSTERS) for i in range(200)}) == len(CLUSTERS)
    assert home_cluster("job1", None, []) is None


def claim_all(replicas: list[Shards], rounds: int = 3) -> None:
    for _ in range(rounds):
        for shards in replicas:
            shards.claim()


def assert_partition(replicas: list[Shards]) -> None:
    held = [s.held for s in replicas]
    assert set().union(*held) == set(CLUSTERS)
    assert sum(len(h) for h in held) == len(CLUSTERS)  # no cluster held by two


def test_replicas_split_the_clusters_and_a_dead_ones_are_taken_once_its_leases_lapse(store):
    clock = ManualClock(1000000.0)
    replicas = [Shards(store, name, 30.0, lambda: CLUSTERS, clock=clock) for name in ("a", "b", "c")]
    replicas[0].claim()
    assert replicas[0].held == set(CLUSTERS)  # the first one alone holds everything
    claim_all(replicas)
    assert_partition(replicas)
    assert sorted(len(s.held) for s in replicas) == [2, 2, 3] and {s.replicas for s in replicas} == {3}
    # "b" dies (stops renewing). Within its lease, nobody takes its clusters...
    dead, alive = replicas[1], [replicas[0], replicas[2]]
    lost = set(dead.held)
    clock.now += 29.0
    claim_all(alive)
    assert not lost & (alive[0].held | alive[1].held)
    # The others know when its leases lapse if it does not renew them (the server's loop wakes then)...
    assert alive[0].seconds_to_next_lapse() == pytest.approx(1.0)
    # ...once they lapse, the others take its clusters on their next tick.
    clock.now += 2.0
    claim_all(alive, rounds=1)
    assert alive[0].held | alive[1].held == set(CLUSTERS)
    assert sorted(len(s.held) for s in alive) == [3, 4] and {s.replicas for s in alive} == {2}


def test_a_replica_that_stops_hands_its_clusters_over_at_once(store):
    clock = ManualClock(1000000.0)
    replicas = [Shards(store, name, 30.0, lambda: CLUSTERS, clock=clock) for name in ("a", "b")]
    claim_all(replicas)
    assert_partition(replicas)
    replicas[1].release_all()
    replicas[0].claim()
    assert replicas[0].held == set(CLUSTERS) and replicas[0].replicas == 1


def test_a_replica_keeps_the_clusters_whose_jobs_it_is_still_submitting(store):
    """A cluster beyond the share, or one given up on stopping, stays leased while a submission of one of
    its jobs still runs: another replica that took it would place that job again."""
    clock = ManualClock(1000000.0)
    a, b = (Shards(store, name, 30.0, lambda: CLUSTERS, clock=clock) for name in ("a", "b"))
    a.claim()
    assert a.held == set(CLUSTERS)
    b.claim()  # "b" joins: "a" would give up three clusters, but keeps c6 while submitting there
    a.claim(keep={"c6"})
    b.claim()
    assert "c6" in a.held and "c6" not in b.held and len(a.held) == 5 and not a.held & b.held
    a.claim()  # the submission ended: c6 goes like the rest beyond the share
    b.claim()
    assert_partition([a, b])
    assert "c6" not in a.held and len(a.held) == 4
    # Stopping during a submission: its cluster's lease is left to lapse, the others handed over at once.
    kept = sorted(a.held)[0]
    a.release_all(keep={kept})
    b.claim()
    assert kept not in b.held and len(b.held) == len(CLUSTERS) - 1
    clock.now += 31.0
    b.claim()
    assert b.held == set(CLUSTERS)


def test_two_controllers_on_one_store_drive_each_managed_job_exactly_once(store):
    """Fifty managed jobs, two replicas ticking in turn over three fake clusters: every job gets exactly one
    attempt, each submitted once, whichever replica recorded it; then one replica dies and the other
    drives its jobs to their end."""
    from corral import managed
    from corral.controller.engine import Controller, ControllerSettings
    from corral.infra.base import JobState
    from corral.task import parse_task
    from tests.test_seam import fakes

    client = fakes()
    clock = ManualClock(1000000.0)
    controllers = [Controller(client, store, name, ControllerSettings()) for name in ("a", "b")]
    for controller in controllers:
        controller.shards.clock = clock
    task = parse_task({"resources": {"cpus": 1}, "run": "true"}, "t")
    jobs = [managed.record(store, task, "t")[0] for _ in range(50)]
    for _ in range(3):
        reports = [asyncio.run(c.tick()) for c in controllers]
    assert {len(r.clusters) for r in reports} == {1, 2}  # three clusters split two and one
    assert set(reports[0].clusters) | set(reports[1].clusters) == {"alpine", "borealis", "cirrus"}
    attempts = store.attempts_of(jobs)
    assert all(len(attempts[j]) == 1 for j in jobs)
    requests = sum(len(infra.requests) for infra in client.infras.values())
    assert requests == len(jobs)  # each job submitted once
    # Each drove only the jobs whose cluster it holds.
    assert reports[0].jobs + reports[1].jobs == len(jobs)
    # "b" dies; "a" takes its clusters once their leases lapse, and sees every job to its end.
    for infra in client.infras.values():
        for handle in list(infra.jobs):
            infra.finish(handle, JobState.SUCCEEDED)
    clock.now += 31.0
    report = asyncio.run(controllers[0].tick())
    assert report.clusters == ["alpine", "borealis", "cirrus"] and report.jobs == len(jobs)
    views = managed.views(store, jobs)
    assert {v.managed.state for v in views} == {"SUCCEEDED"}
    assert sum(len(infra.requests) for infra in client.infras.values()) == len(jobs)


def test_a_cluster_another_replica_took_first_is_passed_over_for_the_next_free_one(store, monkeypatch):
    clock = ManualClock(1000000.0)
    a = Shards(store, "a", 30.0, lambda: CLUSTERS, clock=clock)
    store.acquire_lease("replica:b", "b", 30.0, now=clock.now, note=cluster_list_note(CLUSTERS))
    acquire = store.acquire_lease
    stolen: list[str] = []

    def racing(name, holder, ttl, now=None, note=None):
        if name.startswith("cluster:") and holder == "a" and not stolen:
            stolen.append(name)
            acquire(name, "b", ttl, now=now)  # b takes it between a's read of the leases and a's take
        return acquire(name, holder, ttl, now=now, note=note)

    monkeypatch.setattr(store, "acquire_lease", racing)
    assert len(a.claim()) == 4  # its whole share in this one claim, not one short until the next tick
    assert stolen and stolen[0].removeprefix("cluster:") not in a.held


def test_replicas_that_read_different_cluster_lists_drive_nothing_and_say_why_until_they_agree(store):
    """A job not yet placed is homed by the cluster list: two replicas reading different lists would each
    home it on a cluster they hold and both place it. So neither holds a cluster, or the chores lease,
    while their lists differ (a cluster more, or the same ones in another order); no job is submitted;
    each says why. Once they read the same list they share the clusters again."""
    from corral import managed
    from corral.controller.engine import LEASE, Controller, ControllerSettings
    from corral.task import parse_task
    from tests.test_seam import fakes

    clock = ManualClock(1000000.0)
    a_client = fakes()
    b_client = type(a_client)(a_client.infras)  # the same clusters, read from another file
    b_client.registry.order = ["cirrus", "alpine", "borealis"]  # the same clusters, another order
    controllers = [Controller(client, store, name, ControllerSettings()) for name, client
                   in (("a", a_client), ("b", b_client))]
    for controller in controllers:
        controller.shards.clock = clock
    task = parse_task({"resources": {"cpus": 1}, "run": "true"}, "t")
    jobs = [managed.record(store, task, "t")[0] for _ in range(20)]
    first = asyncio.run(controllers[0].tick())  # alone: "a" drives everything
    assert first.clusters == ["alpine", "borealis", "cirrus"] and first.submitted == 20
    assert asyncio.run(controllers[1].tick()).disagreement  # "b" starts, and sees "a"'s other list
    jobs += [managed.record(store, task, "t")[0] for _ in range(20)]
    for _ in range(2):
        reports = [asyncio.run(c.tick()) for c in controllers]
    assert [r.drove for r in reports] == [False, False] and store.leases("cluster:") == []
    assert store.lease(LEASE) is None
    assert "this one, b, reads 3 clusters, digest" in reports[1].disagreement
    assert "; a reads 3 clusters, digest" in reports[1].disagreement
    assert "this one, a, reads" in reports[0].disagreement and "; b reads" in reports[0].disagreement
    assert sum(len(infra.requests) for infra in a_client.infras.values()) == 20
    assert all(not attempts for attempts in store.attempts_of(jobs[20:]).values())  # none placed, by either
    # "b" is given the same list: they share the clusters and place the new jobs, each exactly once.
    b_client.registry.order = ["alpine", "borealis", "cirrus"]
    for _ in range(3):
        reports = [asyncio.run(c.tick()) for c in controllers]
    assert [r.disagreement for r in reports] == [None, None]
    assert sorted(reports[0].clusters + reports[1].clusters) == ["alpine", "borealis", "cirrus"]
    attempts = store.attempts_of(jobs)
    assert all(len(attempts[j]) == 1 for j in jobs)


def test_a_replica_whose_heartbeat_says_no_cluster_list_is_an_older_corral_and_counts_as_disagreeing(store):
    clock = ManualClock(1000000.0)
    store.acquire_lease("replica:old", "old", 30.0, now=clock.now)  # as a replica before lease notes
    shards = Shards(store, "new", 30.0, lambda: CLUSTERS, clock=clock)
    assert shards.claim() == set()
    assert "old reads a list it does not say (an older Corral)" in shards.disagreement
    clock.now += 31.0  # it is gone
    assert shards.claim() == set(CLUSTERS) and shards.disagreement is None
