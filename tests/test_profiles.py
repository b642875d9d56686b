"""Cluster profiles, pure: how a profile and a task merge (the task wins, a partition over its cluster),
what a job's setup and run become (golden file), what `corral check` says a profile names wrongly, and
the errors a bad profile gets."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from corral.errors import ConfigError
from corral.infra.base import ClusterSnapshot, Partition
from corral.launch import Launcher
from corral.placement import Candidate
from corral.profiles import ClusterProfile, Profiles, profile_warnings
from corral.task import parse_task, resource_options
from tests.infra.slurm.test_jobscript import check_golden

CONFIG = """\
clusters:
  alpine:
    account: research
    qos: normal
    env: {NCCL_DEBUG: WARN, SITE: alpine}
    setup_prefix: module load cuda/12.1
    paths: {CORRAL_SCRATCH: /scratch/$USER, DATA: ~/data}
    sbatch_args: [--exclusive]
    avoid_partitions: [inference]
    partitions:
      gpu:
        qos: gpu-high
        time: "2-00:00:00"
        setup_prefix: module load nccl/2.20
"""


def profiles(tmp_path, monkeypatch, text: str = CONFIG) -> Profiles:
    monkeypatch.setenv("CORRAL_HOME", str(tmp_path))
    (tmp_path / "config.yaml").write_text(text)
    return Profiles.load(["alpine", "borealis", "cirrus"])


def test_the_task_wins_over_the_partition_which_wins_over_the_cluster(tmp_path, monkeypatch):
    found = profiles(tmp_path, monkeypatch)
    task = parse_task({"envs": {"SITE": "mine"}, "slurm": {"qos": "mine", "sbatch_args": ["--comment=x"]},
                       "run": "x"}, "t")
    gpu = found.settings("alpine", "gpu", task)
    assert dict(gpu.scheduler_options) == {"account": "research", "qos": "mine", "time": "2-00:00:00",
                                           "sbatch_args": ["--exclusive", "--comment=x"]}
    assert dict(gpu.env) == {"NCCL_DEBUG": "WARN"}  # SITE is the task's
    assert gpu.setup_prefix == "module load cuda/12.1\nmodule load nccl/2.20"
    cpu = found.settings("alpine", "cpu", parse_task({"run": "x"}, "t"))
    assert cpu.scheduler_options["qos"] == "normal" and "time" not in cpu.scheduler_options
    assert found.settings("borealis", "h100-cluster", parse_task({"slurm": {"account": "a"}, "run": "x"}, "t")) \
        .scheduler_options == {"account": "a"}  # no profile: the task alone


def test_an_avoided_partition_is_kept_only_when_the_task_names_it(tmp_path, monkeypatch):
    found = profiles(tmp_path, monkeypatch)
    assert found.avoided("alpine", "inference", parse_task({"run": "x"}, "t"))
    assert not found.avoided("alpine", "inference", parse_task({"resources": {"infra": "slurm/alpine/inference"},
                                                                "run": "x"}, "t"))
    assert not found.avoided("alpine", "gpu", parse_task({"run": "x"}, "t"))


def test_what_setup_and_run_become_on_the_node(tmp_path, monkeypatch):
    found = profiles(tmp_path, monkeypatch)
    task = parse_task({"envs": {"DATA": "/mine"}, "setup": "pip list", "run": "python train.py"}, "t")
    [option] = resource_options(task.resources)
    candidate = Candidate("alpine", "gpu", option, True, runs_with=found.settings("alpine", "gpu", task))
    request = Launcher.job_request(task, candidate, "tok", ("c-1",), {"DATA": "/mine"})
    check_golden("profile-run.sh", request.run or "")
    assert request.setup == (request.run or "").replace("python train.py", "pip list")
    assert request.envs == {"NCCL_DEBUG": "WARN", "SITE": "alpine", "DATA": "/mine"}
    assert request.scheduler_options["account"] == "research"
    # The path lines as bash runs them: $USER and ~ expand on the node; a name the task sets is the task's.
    out = subprocess.run(["bash", "-c", request.run.split("\nmodule")[0] + '\necho "$CORRAL_SCRATCH|$DATA"'],
                         env={"USER": "ana", "HOME": "/home/ana", "DATA": "/mine"}, capture_output=True, text=True)
    assert out.stdout == "/scratch/ana|/mine\n"
    # Without a profile, setup and run are the task's own, byte for byte.
    bare = Candidate("borealis", "h100-cluster", option, True, runs_with=found.settings("borealis", "x", task))
    assert Launcher.job_request(task, bare, "tok", ("c-1",), {}).run == "python train.py"


def test_check_names_what_the_cluster_does_not_know():
    found = Profiles({"borealis": ClusterProfile.model_validate({"account": "nosuch", "qos": "normal,fast",
                                                               "partitions": {"gpu": {}}, "avoid_partitions": ["l40s"]})})
    parts = (Partition("h100-cluster", True, "UP", "2-00:00:00", None, 2), Partition("l40s", False, "UP", "1:00:00",
                                                                                      None, 1))
    known = ClusterSnapshot("borealis", "22.05", (), parts, accounts=("research",), qos=("normal",))
    assert profile_warnings("borealis", known, found) == [
        "the profile names partition 'gpu', which borealis does not have (partitions: h100-cluster, l40s)",
        "the profile names account 'nosuch', which your user has no association with on borealis (yours: research)",
        "the profile names QOS 'fast', which your user has no association with on borealis (yours: normal)"]
    unknown = ClusterSnapshot("borealis", "22.05", (), parts)
    assert profile_warnings("borealis", unknown, found)[1].startswith("could not check the profile's account nosuch")


@pytest.mark.parametrize(("text", "message"), [
    ("clusters:\n  alpne: {account: a}\n", "clusters.alpne: no such cluster in the cluster file"),
    ("clusters:\n  alpine: {acount: a}\n", "clusters.alpine: unknown setting 'acount'"),
    ("clusters:\n  alpine: {qos: 'a b'}\n", "invalid qos 'a b'"),
    ("clusters:\n  alpine: {paths: {S: '/scratch/$(id)'}}\n", "paths S: '/scratch/$(id)'"),
    ("clusters:\n  alpine: {paths: {CORRAL_TASK_ID: /x}}\n", "a variable name that Corral does not set itself"),
    ("clusters:\n  alpine: {env: {CORRAL_X: y}}\n", "not starting with CORRAL_"),
    ("clusters:\n  alpine: {env: {N: 1}}\n", "env.N: Input should be a valid string"),
    ("clusters:\n  alpine: {partitions: {gpu: {avoid_partitions: [x]}}}\n", "avoid_partitions: unknown field"),
    ("clusters:\n  alpine: {time: forever}\n", "invalid time 'forever'"),
])
def test_a_bad_profile_says_what_and_where(tmp_path, monkeypatch, text, message):
    with pytest.raises(ConfigError) as error:
        profiles(tmp_path, monkeypatch, text)
    assert message in str(error.value) and "config.yaml" in str(error.value)


def test_the_config_example_in_the_docs_loads(tmp_path, monkeypatch):
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[1] / "docs" / "profiles.md").read_text()
    example = docs.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert set(profiles(tmp_path, monkeypatch, example).clusters) == set(yaml.safe_load(example)["clusters"])


def test_check_warns_of_a_profile_path_on_a_filesystem_the_nodes_do_not_share():
    found = Profiles({"alpine": ClusterProfile.model_validate(
        {"paths": {"CORRAL_SCRATCH": "/scratch/$USER", "DATA": "/lustre/data"}})})
    parts = (Partition("gpu", True, "UP", "1:00:00", None, 2),)
    snapshot = ClusterSnapshot("alpine", "22.05", (), parts, path_filesystems={"/scratch/$USER": "ext2/ext3",
                                                                              "/lustre/data": "lustre"})
    assert profile_warnings("alpine", snapshot, found) == [
        "the profile's CORRAL_SCRATCH (/scratch/$USER) is on ext2/ext3, which the compute nodes may not share: "
        "a multi-node job's nodes would not see each other's files there"]


def test_the_walltime_reaches_the_request_in_seconds_from_the_task_or_the_profile(tmp_path, monkeypatch):
    """Infras that enforce it themselves (pools, Kubernetes) read `time_limit_seconds`; Slurm its `time`."""
    found = profiles(tmp_path, monkeypatch)

    def limit(slurm: dict, partition: str = "gpu") -> int | None:
        task = parse_task({"slurm": slurm, "run": "x"}, "t")
        [option] = resource_options(task.resources)
        candidate = Candidate("alpine", partition, option, True, runs_with=found.settings("alpine", partition, task))
        return Launcher.job_request(task, candidate, "tok", ("c-1",), {}).time_limit_seconds

    assert limit({"time": "1:30:00"}) == 5400 and limit({"time": "90"}) == 5400 and limit({"time": "0:05"}) == 5
    assert limit({}) == 2 * 86400  # the partition profile's
    assert limit({}, "cpu") is None and limit({"time": "UNLIMITED"}) is None
