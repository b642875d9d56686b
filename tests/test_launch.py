"""How a sweep is split into per-cluster job arrays (on candidates from recorded probe output)."""

from corral.launch import split_sweep
from corral.placement import build_plan
from corral.task import parse_task, resource_options
from tests.test_placement import ORDER, SNAPSHOTS


def feasible(data):
    task = parse_task(data, "t")
    return build_plan(task, resource_options(task.resources), SNAPSHOTS, ORDER).feasible()


def summary(shares):
    return [(c.cluster, c.partition, first, count) for c, first, count in shares]


def test_sweep_fills_free_capacity_in_rank_order_then_queues_the_rest_on_the_best():
    candidates = feasible({"resources": {"accelerators": "gpu:4"}})
    # cirrus b300: 2 nodes x 8 free -> 4 copies; alpine gpu: 2 free on a1 -> none; borealis l40s: 4 free -> 1.
    assert [(c.cluster, c.partition, c.startable_copies) for c in candidates if c.startable_now] == [
        ("borealis", "l40s", 1), ("cirrus", "b300", 4)]
    assert summary(split_sweep(candidates, 3)) == [("borealis", "l40s", 0, 1), ("cirrus", "b300", 1, 2)]
    best = candidates[0]
    assert summary(split_sweep(candidates, 10)) == [
        ("borealis", "l40s", 0, 1), ("cirrus", "b300", 1, 4), (best.cluster, best.partition, 5, 5)]


def test_single_job_is_one_share_on_the_best_candidate():
    candidates = feasible({"resources": {"accelerators": "B300:8"}})
    assert summary(split_sweep(candidates, 1)) == [("cirrus", "b300", 0, 1)]
