"""A cluster's Slurm command budget on a clock the test turns: a quarter at once, then the budget's rate,
and never more than the budget in any minute; a busy controller's back-off, doubling and ended by the
next normal answer."""

from __future__ import annotations

import asyncio

import pytest

from corral.budget import BACKOFF_MAX, Budget, configured_per_minute
from corral.errors import ClusterBusyError
from corral.ssh import _within_budget
from tests.helpers import ManualClock



def test_a_quarter_passes_at_once_the_rest_at_the_budget_s_rate_and_never_more_than_the_budget_a_minute():
    clock = ManualClock()
    budget = Budget(60, clock)  # one command a second; a burst of 15
    for _ in range(3):
        assert budget.wait_seconds(4) == 0
        budget.spend(4)
    assert budget.wait_seconds(4) == pytest.approx(1.0)  # 3 tokens left, one a second
    spent: list[tuple[float, int]] = [(clock.now, 12)]
    for _ in range(200):  # a caller that takes every slot as soon as it comes, for minutes
        clock.now += budget.wait_seconds(4)
        budget.spend(4)
        spent.append((clock.now, 4))
        in_window = sum(c for when, c in spent if when > clock.now - 60)
        assert in_window <= 60, (clock.now, in_window)
    assert budget.report()["used_last_minute"] <= 60
    clock.now += 61
    assert budget.report()["used_last_minute"] == 0  # a minute on, nothing counted any more
    assert budget.wait_seconds(1000) == 0  # a round trip dearer than the budget waits for a full bucket only


def test_the_minute_s_window_holds_after_a_burst():
    clock = ManualClock()
    budget = Budget(8, clock)  # a burst of 2
    for _ in range(8):
        clock.now += budget.wait_seconds(1)
        budget.spend(1)
    assert budget.report()["used_last_minute"] == 8
    assert budget.wait_seconds(1) == pytest.approx(1000.0 + 60 - clock.now)  # until the first command's minute ends


def test_a_busy_controller_backs_off_doubling_and_a_normal_answer_ends_it():
    clock = ManualClock()
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
    budget = Budget(600)  # ten a second, on the real clock; a burst of 150
    for _ in range(150):
        budget.spend(1)
    asyncio.run(_within_budget("alpine", budget, 2, timeout=5))  # 0.2 s of refill: it waits, then goes
    assert budget.report()["used_last_minute"] == 152
    with pytest.raises(ClusterBusyError, match=r"alpine: Corral's budget of 600 Slurm commands a minute there is "
                                               r"spent \(rpc_budget in config.yaml\); the next slot comes in \d+ s"):
        asyncio.run(_within_budget("alpine", budget, 500, timeout=1))
    busy = Budget(600)
    busy.answered("Socket timed out on send/recv operation")
    with pytest.raises(ClusterBusyError, match="its Slurm controller is busy .*backs off for"):
        asyncio.run(_within_budget("cirrus", busy, 1, timeout=0.5))


def test_a_status_poll_is_refused_at_once_during_a_back_off_and_a_submission_waits_it_out():
    """A tick's status query that waited out a back-off (2, 4, 8, 16 s within its 30 s timeout) held up
    every other cluster's news: with one controller down, a job took 70 s to be seen recovered."""
    import time

    busy = Budget(600)
    busy.answered("Unable to contact slurm controller (connect failure)")  # 2 s of back-off
    started = time.monotonic()
    with pytest.raises(ClusterBusyError, match="its Slurm controller is busy"):
        asyncio.run(_within_budget("alpine", busy, 2, timeout=30, poll=True))
    assert time.monotonic() - started < 0.5
    asyncio.run(_within_budget("alpine", busy, 1, timeout=30))  # not a poll: it waits, then goes
    assert time.monotonic() - started >= 1.5 and busy.report()["used_last_minute"] == 1
    asyncio.run(_within_budget("alpine", busy, 1, timeout=30, poll=True))  # the back-off over: a poll goes too
    assert busy.report()["used_last_minute"] == 2


def test_the_budget_comes_from_the_config_per_cluster_first(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("rpc_budget: {commands_per_minute: 120}\n"
                                      "clusters: {alpine: {rpc_budget: {commands_per_minute: 30}}}\n")
    monkeypatch.setenv("CORRAL_HOME", str(home))
    assert (configured_per_minute("alpine"), configured_per_minute("borealis")) == (30, 120)


def test_replicas_split_each_cluster_s_budget_evenly(monkeypatch):
    from corral import budget

    monkeypatch.setattr(budget, "_BUDGETS", {})
    monkeypatch.setattr(budget, "_REPLICAS", 1)
    clock = ManualClock()
    alpine = budget._BUDGETS["alpine"] = Budget(600, clock)
    budget.share_between(3)
    assert alpine.per_minute == 200 and alpine.burst == 50  # this replica's third
    assert budget.report()["alpine"]["configured_per_minute"] == 600 and budget.report()["alpine"]["replicas"] == 3
    for _ in range(4):
        clock.now += 15
        alpine.spend(50)
    assert alpine.wait_seconds(1) > 0  # 200 spent in the last minute: its share is used up
    assert budget.budget_for("borealis", 90).per_minute == 30  # a budget made later is shared too
    budget.share_between(1)
    assert alpine.per_minute == 600


def test_commands_a_round_trip_did_not_run_are_given_back():
    """A status refresh is charged for the light query, squeue and sacct before it goes; when its
    script stopped after the light query, the two it did not run count neither in the minute nor
    against the bucket."""
    clock = ManualClock()
    budget = Budget(60, clock)  # a burst of 15
    budget.spend(3)
    budget.give_back(2)
    assert budget.report()["used_last_minute"] == 1
    assert budget.tokens == pytest.approx(14)
    for _ in range(14):
        budget.spend(1)
    assert budget.wait_seconds(1) > 0  # the bucket is empty: what was given back was spent again
    budget.give_back(100)  # never more than was spent, nor more than a full bucket
    assert budget.report()["used_last_minute"] == 0 and budget.tokens <= budget.burst
