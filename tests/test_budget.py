"""A cluster's Slurm command budget on a clock the test turns: bursts up to a minute's budget, then the
refill rate; a busy controller's back-off, doubling and ended by the next normal answer."""

from __future__ import annotations

import asyncio

import pytest

from corral.budget import BACKOFF_MAX, Budget, configured_per_minute
from corral.errors import ClusterBusyError
from corral.ssh import _within_budget


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_minute_s_budget_passes_at_once_then_the_refill_rate():
    clock = Clock()
    budget = Budget(60, clock)  # one command a second
    for _ in range(15):
        assert budget.wait_seconds(4) == 0
        budget.spend(4)
    assert budget.report()["used_last_minute"] == 60
    assert budget.wait_seconds(4) == pytest.approx(4.0)  # four commands at one a second
    clock.now += 4
    assert budget.wait_seconds(4) == 0
    clock.now += 61
    assert budget.report()["used_last_minute"] == 0  # a minute on, nothing counted any more
    assert budget.wait_seconds(1000) == 0  # a round trip dearer than the budget waits for a full bucket only


def test_a_busy_controller_backs_off_doubling_and_a_normal_answer_ends_it():
    clock = Clock()
    budget = Budget(600, clock)
    budget.answered("squeue: error: slurm_load_jobs error: Socket timed out on send/recv operation")
    assert budget.wait_seconds(1) == pytest.approx(2.0)
    assert budget.report()["busy_reason"] == "Socket timed out on send/recv operation"
    budget.answered("sbatch: error: Slurm temporarily unable to accept job, sleeping and retrying")
    assert budget.wait_seconds(1) == pytest.approx(4.0)
    for _ in range(10):
        budget.answered("Resource temporarily unavailable")
    assert budget.wait_seconds(1) == pytest.approx(BACKOFF_MAX)
    clock.now += BACKOFF_MAX
    budget.answered("JOBID|STATE\n")
    assert budget.wait_seconds(1) == 0 and budget.backoff == 0 and budget.report()["busy_reason"] is None


def test_a_caller_waits_within_its_timeout_and_past_it_is_told_when_the_next_slot_comes():
    budget = Budget(600)  # ten a second, on the real clock
    for _ in range(600):
        budget.spend(1)
    asyncio.run(_within_budget("alpine", budget, 2, timeout=5))  # 0.2 s of refill: it waits, then goes
    assert budget.report()["used_last_minute"] == 602
    with pytest.raises(ClusterBusyError, match=r"alpine: Corral's budget of 600 Slurm commands a minute there is "
                                               r"spent \(rpc_budget in config.yaml\); the next slot comes in \d+ s"):
        asyncio.run(_within_budget("alpine", budget, 500, timeout=1))
    busy = Budget(600)
    busy.answered("Socket timed out on send/recv operation")
    with pytest.raises(ClusterBusyError, match="its Slurm controller is busy .*backs off for"):
        asyncio.run(_within_budget("cirrus", busy, 1, timeout=0.5))


def test_the_budget_comes_from_the_config_per_cluster_first(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("rpc_budget: {commands_per_minute: 120}\n"
                                      "clusters: {alpine: {rpc_budget: {commands_per_minute: 30}}}\n")
    monkeypatch.setenv("CORRAL_HOME", str(home))
    assert (configured_per_minute("alpine"), configured_per_minute("borealis")) == (30, 120)
