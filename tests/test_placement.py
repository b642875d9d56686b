"""Placement on snapshots parsed from recorded real probe output."""

from __future__ import annotations

import math

from corral.infra.slurm.probe import parse_probe_output
from corral.placement import DEFAULT_KIND_ORDER, build_plan, named, slurm_minutes
from corral.task import Task, parse_task, resource_options
from tests.conftest import FIXTURES


def snapshot(name: str, cluster: str):
    return parse_probe_output(cluster, (FIXTURES / "probe" / f"{name}.txt").read_text(), 5)


SNAPSHOTS = {
    "alpine": snapshot("alpine-busy", "alpine"),  # gpu: 2 of 8 H100 free (a1); inference drained
    "borealis": snapshot("borealis-draining", "borealis"),  # h100: none free; l40s: 4 free
    "cirrus": snapshot("cirrus-idle", "cirrus"),  # all free; untyped gpu on debug
}
ORDER = ["alpine", "borealis", "cirrus"]


def plan_for(data: dict, snapshots=SNAPSHOTS):
    task = parse_task(data, "t")
    return build_plan(task, resource_options(task.resources), snapshots, ORDER)


def places(candidates):
    return [(c.cluster, c.partition) for c in candidates]


def test_gpus_only_one_cluster_has():
    plan = plan_for({"resources": {"accelerators": "B300:8"}})
    assert places(plan.feasible()) == [("cirrus", "b300")]
    assert plan.feasible()[0].gres == "gpu:b300:8" and plan.feasible()[0].startable_now


def test_site_spellings_map_to_the_sites_gres_type():
    plan = plan_for({"resources": {"accelerators": "H100:2"}})
    gres = {(c.cluster, c.partition): c.gres for c in plan.feasible()}
    assert gres == {("alpine", "gpu"): "gpu:nvidia_h100_80gb_hbm3:2", ("borealis", "h100-cluster"): "gpu:H100:2"}
    # alpine has 2 free on a1: can start now; borealis has none free.
    assert [c.startable_now for c in plan.feasible()] == [True, False]


def test_more_than_free_goes_where_capacity_is():
    plan = plan_for({"resources": {"accelerators": "H100:4"}})
    # Neither can start now; borealis has no queue pressure, alpine has 11 GPUs wanted for its 8.
    assert [(c.cluster, c.startable_now) for c in plan.feasible()] == [("borealis", False), ("alpine", False)]
    free = dict(SNAPSHOTS)
    free["borealis"] = snapshot("borealis-node-down", "borealis")
    # A node that stopped responding still belongs to the cluster: feasible, but not startable now.
    [l40s] = plan_for({"resources": {"accelerators": "L40S:2"}}, free).feasible()
    assert (l40s.cluster, l40s.startable_now, l40s.free_gpus) == ("borealis", False, 0)


def test_infeasible_reasons():
    plan = plan_for({"num_nodes": 3, "resources": {"accelerators": "H100:8"}})
    reasons = {(c.cluster, c.partition): c.reason for c in plan.candidates}
    # What no node has enough of is told as the most one has; too few nodes that fit, as how many.
    assert reasons[("alpine", "gpu")] == "needs 3 node(s) with H100:8; partition has 0 (at most H100:4 a node)"
    assert reasons[("borealis", "h100-cluster")] == "needs 3 node(s) with H100:8; partition has 2"
    big = plan_for({"resources": {"accelerators": "H100:1", "cpus": 10000, "memory": 100000}})
    [why] = [c.reason for c in big.candidates if (c.cluster, c.partition) == ("alpine", "gpu")]
    assert why == ("needs 1 node(s) with H100:1, cpus=10000, memory=100000GB; partition has 0 "
                   "(at most 8 CPUs, 62.5 GB of memory a node)")  # the GPU fits: not named
    assert reasons[("alpine", "inference")] == "no H100 GPUs (has L4)"
    assert reasons[("cirrus", "maint")] == "partition has no nodes"
    assert reasons[("cirrus", "debug")] == "no H100 GPUs (has gpu)"


def test_places_with_one_reason_share_its_line_and_an_unreachable_place_is_named_once():
    task = parse_task({"resources": {"accelerators": "A100:1"}}, "t")
    plan = build_plan(task, resource_options(task.resources), SNAPSHOTS, [*ORDER, "delta"],
                      {"delta": "delta: ssh: connect to host d port 22: refused"})
    assert plan.refusals() == [
        "slurm/alpine/gpu, slurm/borealis/h100-cluster: no A100 GPUs (has H100)",
        "slurm/alpine/cpu: no A100 GPUs (has no GPUs)",
        "slurm/alpine/inference: no A100 GPUs (has L4)",
        "slurm/borealis/l40s: no A100 GPUs (has L40S)",
        "slurm/cirrus/b300: no A100 GPUs (has B300)",
        "slurm/cirrus/debug: no A100 GPUs (has gpu)",
        "slurm/cirrus/maint: partition has no nodes",
    ]
    assert plan.unanswered() == ["slurm/delta: ssh: connect to host d port 22: refused"]
    assert named([f"c{i}" for i in range(4)]) == "c0, c1, c2, c3"
    assert named([f"c{i}" for i in range(50)]) == "c0, c1, c2 and 47 more"


def test_l4_is_not_l40s_and_generic_gpu_takes_any():
    assert places(plan_for({"resources": {"accelerators": "L4:1"}}).feasible()) == [("alpine", "inference")]
    generic = plan_for({"resources": {"accelerators": "gpu:2"}}).feasible()
    assert ("cirrus", "debug") in places(generic)
    assert {c.gres for c in generic if c.cluster == "cirrus"} >= {"gpu:2"}


def test_cpu_task_prefers_cpu_partitions_and_checks_cpus():
    # Only alpine: no partition can start 8 CPUs now, so the CPU-only partition comes first.
    plan = plan_for({"resources": {"cpus": 8}}, {"alpine": SNAPSHOTS["alpine"]})
    assert [(c.partition, c.wastes_gpus) for c in plan.feasible()] == [("cpu", False), ("gpu", True),
                                                                      ("inference", True)]
    assert plan_for({"resources": {"cpus": 64}}).feasible() == []


def test_time_limit_and_pinning():
    plan = plan_for({"resources": {"accelerators": "gpu:1"}, "slurm": {"time": "2:00:00"}})
    reasons = {(c.cluster, c.partition): c.reason for c in plan.candidates}
    assert reasons[("cirrus", "debug")] == "time 2:00:00 exceeds the partition's limit 01:00:00"
    pinned = plan_for({"resources": {"accelerators": "H100:1", "infra": "slurm/borealis"}})
    assert {c.cluster for c in pinned.candidates} == {"borealis"}


def test_ordered_preference_breaks_ties():
    data = {"resources": {"ordered": [{"accelerators": "B300:1"}, {"accelerators": "L40S:1"}]}}
    assert places(plan_for(data).feasible()) == [("cirrus", "b300"), ("borealis", "l40s")]
    data = {"resources": {"ordered": [{"accelerators": "L40S:1"}, {"accelerators": "B300:1"}]}}
    assert places(plan_for(data).feasible()) == [("borealis", "l40s"), ("cirrus", "b300")]


def test_image_needs_a_container_runtime_and_gets_the_preferred_one():
    from dataclasses import replace

    data = {"resources": {"accelerators": "B300:1", "image_id": "docker:nvcr.io/nvidia/pytorch:24.01"}}
    plan = plan_for(data)
    assert plan.feasible() == []
    assert {c.reason for c in plan.candidates if c.partition == "b300"} == {
        "image_id needs a container runtime (Pyxis, Apptainer or Singularity); cirrus has none"}
    for found, chosen in ((("singularity",), "singularity"), (("apptainer", "singularity"), "apptainer"),
                          (("singularity", "apptainer", "pyxis"), "pyxis")):
        with_runtime = {**SNAPSHOTS, "cirrus": replace(SNAPSHOTS["cirrus"], container_runtimes=found)}
        [best] = plan_for(data, with_runtime).feasible()
        assert (best.cluster, best.container_runtime) == ("cirrus", chosen)
    assert all(c.container_runtime is None for c in plan_for({"resources": {"accelerators": "B300:1"}}).candidates)


def test_a_dev_allocation_holds_its_image_with_a_wrapped_runtime_and_never_with_pyxis():
    from dataclasses import replace

    from corral.placement import holding_runtime

    data = {"resources": {"accelerators": "B300:1", "image_id": "docker:ubuntu:22.04"}}
    for found, held in ((("pyxis", "singularity"), "singularity"), (("apptainer",), "apptainer")):
        cirrus = replace(SNAPSHOTS["cirrus"], container_runtimes=found)
        [best] = plan_for(data, {**SNAPSHOTS, "cirrus": cirrus}).feasible()
        assert (holding_runtime(best, cirrus).feasible, holding_runtime(best, cirrus).container_runtime) == (True, held)
    cirrus = replace(SNAPSHOTS["cirrus"], container_runtimes=("pyxis",))
    [best] = plan_for(data, {**SNAPSHOTS, "cirrus": cirrus}).feasible()
    refused = holding_runtime(best, cirrus)
    assert (refused.feasible, refused.startable_now, refused.reason) == (
        False, False, "a dev allocation runs its image with Apptainer or Singularity; cirrus offers only Pyxis "
                      "(a task without -c runs there)")


def test_slurm_minutes():
    assert slurm_minutes("90") == 90
    assert slurm_minutes("4:00:00") == 240
    assert slurm_minutes("2-00:00:00") == 2880
    assert slurm_minutes("1-12") == 2160
    assert slurm_minutes("UNLIMITED") == math.inf


def test_a_task_needing_paths_goes_only_where_they_exist():
    from dataclasses import replace

    data = {"resources": {"accelerators": "B300:1", "paths": ["/datasets/imagenet", "~/ckpt"]}}
    assert plan_for(data).feasible()  # a probe that was not asked about paths: no verdict on them
    probed = {**SNAPSHOTS, "cirrus": replace(SNAPSHOTS["cirrus"], existing_paths=frozenset({"~/ckpt"}))}
    [b300] = [c for c in plan_for(data, probed).candidates if c.partition == "b300"]
    assert not b300.feasible and b300.reason == "needs /datasets/imagenet, which cirrus does not have"
    found = {**SNAPSHOTS, "cirrus": replace(SNAPSHOTS["cirrus"], existing_paths=frozenset({"~/ckpt",
                                                                                           "/datasets/imagenet"}))}
    assert [(c.cluster, c.partition) for c in plan_for(data, found).feasible()] == [("cirrus", "b300")]


def test_among_equal_starts_slurm_first_then_pools_then_kubernetes_unless_told_otherwise():
    """Three idle places of three kinds, each with free L4s: the kind order decides (the config's
    `infra_order`, or the task's own `ordered` list)."""
    from dataclasses import replace as with_

    from corral.infra.base import ClusterSnapshot, GpuPool, Node, Partition

    def place(name: str, kind: str) -> ClusterSnapshot:
        node = Node(f"{name}-n1", (name,), "idle", True, 8, 0, 65536, 0, (GpuPool("L4", 2, 0),))
        return ClusterSnapshot(name, None, (node,), (Partition(name, True, "UP", "UNLIMITED", None, 1),), kind=kind)

    snapshots = {"slurmy": place("slurmy", "slurm"), "lab": place("lab", "ssh"), "kube": place("kube", "k8s")}
    order = ["kube", "lab", "slurmy"]  # the registry's order must not decide
    task = Task.model_validate({"resources": {"accelerators": "L4:1"}})

    def ranked(task: Task, kinds=DEFAULT_KIND_ORDER) -> list[str]:
        plan = build_plan(task, resource_options(task.resources), snapshots, order, kind_order=kinds)
        return [c.infra for c in plan.ranked()]

    assert ranked(task) == ["slurm/slurmy/slurmy", "ssh/lab", "k8s/kube"]
    assert ranked(task, ("k8s", "slurm")) == ["k8s/kube", "slurm/slurmy/slurmy", "ssh/lab"]  # ssh follows, unnamed
    ordered = Task.model_validate({"resources": {"ordered": [{"infra": "k8s", "accelerators": "L4:1"},
                                                             {"infra": "ssh", "accelerators": "L4:1"},
                                                             {"infra": "slurm", "accelerators": "L4:1"}]}})
    assert ranked(ordered) == ["k8s/kube", "ssh/lab", "slurm/slurmy/slurmy"]
    # A place that can start it sooner still wins over the preferred kind.
    busy = Node("slurmy-n1", ("slurmy",), "mixed", True, 8, 8, 65536, 0, (GpuPool("L4", 2, 2),))
    snapshots["slurmy"] = with_(snapshots["slurmy"], nodes=(busy,))
    assert ranked(task)[0] == "ssh/lab"
    # Too few nodes is said in each kind's words: a pool has machines, not a partition.
    wide = Task.model_validate({"num_nodes": 2, "resources": {"accelerators": "L4:1"}})
    plan = build_plan(wide, resource_options(wide.resources), snapshots, order)
    assert {c.infra: c.reason for c in plan.candidates} == {
        "slurm/slurmy/slurmy": "needs 2 node(s) with L4:1; partition has 1",
        "ssh/lab": "needs 2 node(s) with L4:1; pool has 1", "k8s/kube": "needs 2 node(s) with L4:1; context has 1"}


def test_a_constraint_counts_only_the_nodes_with_those_features():
    # borealis's H100 nodes b1 and b2 carry the feature ib (sinfo's Features); alpine's carry none.
    task = parse_task({"resources": {"accelerators": "H100:1"}}, "t")
    plan = build_plan(task, resource_options(task.resources), SNAPSHOTS, ORDER,
                      constraint_at=lambda cluster, partition: "ib")
    assert places(plan.feasible()) == [("borealis", "h100-cluster")]
    why = {(c.cluster, c.partition): c.reason for c in plan.candidates}
    assert why[("alpine", "gpu")] == "no node matches --constraint=ib (its nodes have no features)"
    plan = build_plan(task, resource_options(task.resources), SNAPSHOTS, ORDER,
                      constraint_at=lambda cluster, partition: "ib*3")
    assert why_not(plan, "borealis", "h100-cluster") == "--constraint=ib*3 needs 3 node(s) with ib; the partition has 2"
    unread = build_plan(task, resource_options(task.resources), SNAPSHOTS, ORDER,
                        constraint_at=lambda cluster, partition: "ib&(")
    assert len(unread.feasible()) == len(plan_for({"resources": {"accelerators": "H100:1"}}).feasible())


def why_not(plan, cluster, partition):
    return next(c.reason for c in plan.candidates if (c.cluster, c.partition) == (cluster, partition))


def test_of_places_that_start_it_now_one_whose_budget_takes_the_submission_now_comes_first():
    from dataclasses import replace

    plan = plan_for({"resources": {"cpus": 1}})
    assert plan.feasible()[0].cluster == "alpine" and plan.feasible()[1].startable_now
    plan.candidates = [replace(c, budget_short=c.cluster == "alpine") for c in plan.candidates]
    assert plan.feasible()[0].cluster != "alpine" and plan.feasible()[0].startable_now
    only = plan_for({"resources": {"accelerators": "H100:1"}})  # alpine alone starts it now: still first
    only.candidates = [replace(c, budget_short=c.cluster == "alpine") for c in only.candidates]
    assert only.feasible()[0].cluster == "alpine"
    waiting = plan_for({"resources": {"accelerators": "H100:16"}}).feasible()  # nowhere starts it now
    assert [c.cluster for c in sorted([replace(c, budget_short=True) for c in waiting],
                                      key=lambda c: c.rank_key())] == [c.cluster for c in waiting]
