"""SkyPilot task files unchanged: a corpus covering SkyPilot's documented task spec field by field, in
the shapes its docs show (`tests/fixtures/skypilot/`). Each file validates, names in one warning line
each field that has no meaning on Slurm (and no other), and plans on the real testbed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from corral.controller.rules import recovery_order
from corral.placement import Candidate
from corral.task import RecoveryStrategy, load_task, parse_memory, parse_task, resource_options
from corral.task_compat import IGNORED_RESOURCE_FIELDS, autostop_minutes, ignored_fields

CORPUS = Path(__file__).parent / "fixtures" / "skypilot"
# file -> the fields its warnings name (the text before each warning's first ':')
WARNED = {
    "minimal.yaml": set(),
    "syntax.yaml": {f"resources.{f}" for f in IGNORED_RESOURCE_FIELDS} | {"resources.image_id", "resources.autostop",
                                                                          "config.kubernetes.provision_timeout"},
    "accelerators.yaml": set(),
    "location_forms.yaml": {"resources"},  # the aws and gcp alternatives, skipped
    "cpus_memory.yaml": set(),
    "autostop.yaml": {"resources.autostop"},  # launched as a job; honoured with -c (see below)
    "autostop_forms.yaml": {"resources.ordered[0].autostop", "resources.ordered[1].autostop",
                            "resources.ordered[2].autostop"},
    "job_recovery.yaml": set(),
    "job_recovery_failover.yaml": set(),
    "ports_labels_images.yaml": {"resources.ports", "resources.labels", "resources.image_id", "resources.use_spot",
                                 "resources.disk_size"},
    "docker_image.yaml": set(),
    "file_mounts.yaml": set(),
    "service.yaml": {"resources.ports", "service"},
}


def test_the_corpus_covers_every_field_of_the_spec():
    assert sorted(WARNED) == sorted(p.name for p in CORPUS.glob("*.yaml"))
    used: set[str] = set()
    for path in CORPUS.glob("*.yaml"):
        task = load_task(path)
        used |= set(task.model_dump(exclude_defaults=True))
        for resources in [task.resources, *(task.resources.any_of or []), *(task.resources.ordered or [])]:
            used |= {f"resources.{k}" for k in resources.model_dump(exclude_defaults=True)}
    spec = {"name", "workdir", "num_nodes", "resources", "envs", "secrets", "file_mounts", "setup", "run", "config",
            "service"} | {f"resources.{k}" for k in ("infra", "cloud", "region", "zone", "accelerators", "accelerator_args",
                                                     "cpus", "memory", "instance_type", "use_spot", "disk_size",
                                                     "disk_tier", "network_tier", "max_hourly_cost", "image_id",
                                                     "ports", "labels", "autostop", "any_of", "ordered",
                                                     "job_recovery")}
    assert spec <= used, sorted(spec - used)


@pytest.mark.parametrize("name", sorted(WARNED))
def test_each_file_warns_once_per_field_without_meaning_on_slurm(name):
    task = load_task(CORPUS / name)
    lines = ignored_fields(task)
    assert {line.split(":")[0] for line in lines} == WARNED[name], lines
    assert len(lines) == len(WARNED[name])  # one line per field


def test_each_file_plans_on_the_testbed(corral_env, store_for_plans):
    from corral.client import Client
    from corral.launch import Launcher

    tasks = {p.name: load_task(p) for p in sorted(CORPUS.glob("*.yaml"))}
    launcher = Launcher(Client(), store_for_plans)

    async def plans():
        outcomes = await launcher.probe_for(list(tasks.values()))
        return {name: await launcher.plan(task, predict="never", outcomes=outcomes) for name, task in tasks.items()}

    for name, plan in asyncio.run(plans()).items():
        if name == "docker_image.yaml":  # only cirrus offers a container runtime; the others say so
            assert {c.cluster for c in plan.feasible()} == {"cirrus"}
            assert all("container runtime" in (c.reason or "") or (c.reason or "").startswith("partition ")
                       for c in plan.candidates if c.cluster != "cirrus"), [c.reason for c in plan.candidates]
            continue
        assert plan.feasible(), (name, [(c.infra, c.reason) for c in plan.candidates])
    located = asyncio.run(plans())["location_forms.yaml"].feasible()
    assert {c.cluster for c in located} == {"borealis", "alpine"}  # cloud: slurm + region (+ zone)
    assert {c.partition for c in located if c.cluster == "alpine"} == {"gpu"}


@pytest.fixture
def store_for_plans(tmp_path):
    from corral.state import Store

    return Store(f"sqlite:///{tmp_path / 'state.db'}")


def test_recovery_strategies_and_autostop_forms():
    def strategy(text):
        return parse_task({"resources": {"job_recovery": text}}, "t").resources.job_recovery.strategy

    assert strategy("none") is strategy("NONE") is RecoveryStrategy.NONE
    assert strategy("failover") is RecoveryStrategy.FAILOVER
    assert strategy({"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 2}) is \
        RecoveryStrategy.EAGER_NEXT_REGION
    minutes = {text: autostop_minutes(parse_task({"resources": {"autostop": text}}, "t"))
               for text in (True, False, 10, "10", "30m", "10h", "1d", "1w", "1.5h")}
    assert minutes == {True: 5, False: 0, 10: 10, "10": 10, "30m": 30, "10h": 600, "1d": 1440, "1w": 10080,
                       "1.5h": 90}
    assert autostop_minutes(parse_task({"run": "x"}, "t")) is None


def test_memory_in_skypilots_units():
    assert [(m.value, m.at_least) for m in map(parse_memory, ["32", "32+", "64GB", "64gb+", "1024MB", "1TB",
                                                               "512 MB", 16])] == [
        (32, False), (32, True), (64, False), (64, True), (1, False), (1024, False), (0.5, False), (16, False)]
    for bad in ("lots", "-1", "0", "1XB", "5+GB+"):
        with pytest.raises(ValueError, match="invalid memory"):
            parse_memory(bad)


def test_recovery_goes_back_to_the_same_cluster_or_away_from_it_as_the_strategy_says():
    [option] = resource_options(parse_task({"run": "x"}, "t").resources)
    ranked = [Candidate(c, "p", option, True) for c in ("alpine", "borealis", "cirrus")]
    assert [c.cluster for c in recovery_order(ranked, RecoveryStrategy.FAILOVER, "borealis")] == \
        ["borealis", "alpine", "cirrus"]
    assert [c.cluster for c in recovery_order(ranked, RecoveryStrategy.EAGER_NEXT_REGION, "alpine")] == \
        ["borealis", "cirrus", "alpine"]
    assert recovery_order(ranked, None, "alpine") == ranked  # unset: the soonest start decides
    assert recovery_order(ranked, RecoveryStrategy.FAILOVER, None) == ranked  # a first attempt
