"""A job script's ask, from the corpus of shapes HPC centres document; what keeps one from being routed;
and how its partition lines steer placement (on recorded probes of the testbed's clusters)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from corral.placement import build_plan
from corral.sbatch_script import ScriptError
from corral.script_task import (
    copy_indices,
    read_ask,
    script_constraint,
    script_copies,
    script_nodes,
    script_partitions,
    task_from_script,
    without_excluded,
)
from corral.task import JobScript, resource_options
from tests.conftest import FIXTURES
from tests.test_placement import ORDER, SNAPSHOTS


def script(name: str, options: tuple[str, ...] = ()) -> JobScript:
    return JobScript(text=(FIXTURES / "scripts" / f"{name}.sh").read_text(), file_name=f"{name}.sh",
                     options=list(options))


def inline(text: str, options: tuple[str, ...] = ()) -> JobScript:
    return JobScript(text="#!/bin/bash\n" + text, file_name="job.sh", options=list(options))


@pytest.mark.parametrize(("name", "expected"), [
    # (nodes, GPU type, GPUs per node, CPUs per node, MB per node, time, job name, array)
    ("single_gpu", (1, "h100", 1, 4, 16384, "00:10:00", "single-gpu", None)),
    ("mpi_multinode", (2, None, 0, 2, None, "00:05:00", "mpi-ranks", None)),
    ("array", (1, None, 0, 1, 500, "5", "param-sweep", (0, 2, 4, 6))),
    ("gpus_per_node", (1, "l4", 1, 2, None, "00:05:00", "inference", None)),
    ("het_mem_per_cpu", (2, None, 0, 2, 4000, "00:05:00", "het-mem", None)),  # 1 + 1 nodes, the larger shape
    ("modules", (1, None, 0, 1, None, "00:05:00", "with-modules", None)),
])
def test_the_corpus_asks_for_what_its_directives_say(name, expected):
    ask = read_ask(script(name))
    assert (ask.num_nodes, ask.gpu_type, ask.gpus_per_node, ask.cpus_per_node, ask.memory_mb_per_node, ask.time,
            ask.job_name, ask.array) == expected


def test_gpu_forms_and_the_command_line_winning():
    assert read_ask(inline("#SBATCH -N 2 --gpus=a100:6\n")).gpus_per_node == 3  # --gpus is for the whole job
    assert read_ask(inline("#SBATCH --ntasks-per-node=4 --gpus-per-task=1\n")).gpus_per_node == 4
    assert read_ask(inline("#SBATCH --gres=gpu:2,shard:1\n")).gpu_type is None
    ask = read_ask(inline("#SBATCH --gres=tmpdisk:100\n"))
    assert ask.gpus_per_node == 0
    ask = read_ask(inline("#SBATCH --gres=gpu:a100:1 -t 10\n", ("--gres=gpu:h100:4", "-t", "20")))
    assert (ask.gpu_type, ask.gpus_per_node, ask.time) == ("h100", 4, "20")
    assert read_ask(inline("#SBATCH --mem=0\n")).memory_mb_per_node is None  # all of a node's memory
    assert read_ask(inline("#SBATCH -c 2 --mem-per-gpu=10G --gres=gpu:2\n")).memory_mb_per_node == 20480


def test_what_cannot_be_routed_says_why():
    for text, message in (
            ("#SBATCH -M other\n", "job.sh:2 -M: the script names Slurm clusters"),
            ("#SBATCH --wrap=true\n", "--wrap replaces the script"),
            ("#SBATCH --test-only\n", "give --test-only \\(or --dryrun\\) on corral sbatch.s command line"),
            ("#SBATCH -N x\n", "expected a count"),
            ("#SBATCH --mem=lots\n", "expected a size"),
            ("#SBATCH --gpus-per-node=h100:x\n", r"expected \[type:\]count")):
        with pytest.raises(ScriptError, match=message):
            task_from_script(inline(text), "job.sh")
    with pytest.raises(ScriptError, match=r"job.sh:2 --dependency.*Slurm job 123, 456, which Corral did not submit.*"
                                          r"--infra slurm/<cluster>"):
        task_from_script(inline("#SBATCH --dependency=afterok:123:456_2,singleton\n"), "job.sh")
    pinned = task_from_script(inline("#SBATCH --dependency=afterok:123\n"), "job.sh", infra="slurm/alpine")
    assert resource_options(pinned.resources)[0].infra.cluster == "alpine"
    assert task_from_script(inline("#SBATCH --dependency=singleton\n"), "job.sh").slurm.script is not None


def test_an_array_is_the_jobs_copies():
    task = task_from_script(script("array"), "array.sh")
    assert copy_indices(task) == (0, 2, 4, 6) and script_copies([(task, "array.sh")], 1) == 4
    with pytest.raises(ScriptError, match="own --array"):
        script_copies([(task, "array.sh")], 3)
    single = task_from_script(script("single_gpu"), "single_gpu.sh")
    assert copy_indices(single) is None and script_copies([(single, "s")], 1) == 1
    with pytest.raises(ScriptError, match="on its own"):
        script_copies([(single, "s"), (single, "t")], 1)


def plan_of(job: JobScript):
    task = task_from_script(job, job.file_name)
    return script_partitions(build_plan(task, resource_options(task.resources), SNAPSHOTS, ORDER), task)


def test_a_partition_in_the_script_is_kept_where_the_cluster_has_it():
    plan = plan_of(script("single_gpu"))  # -p gpu: alpine's name; borealis calls its H100s h100-cluster
    feasible = {(c.cluster, c.partition) for c in plan.feasible()}
    assert ("alpine", "gpu") in feasible and ("borealis", "h100-cluster") in feasible
    reasons = {(c.cluster, c.partition): c.reason for c in plan.candidates if not c.feasible}
    assert "no h100 GPUs" in reasons[("alpine", "inference")]  # its own reason first


def test_a_partition_on_the_command_line_is_a_pin():
    plan = plan_of(inline("#SBATCH -c 1\n", ("-p", "debug")))
    assert [(c.cluster, c.partition) for c in plan.feasible()] == [("cirrus", "debug")]
    reasons = {(c.cluster, c.partition): c.reason for c in plan.candidates}
    assert reasons[("alpine", "cpu")] == "the command line pins --partition=debug"
    plan = plan_of(inline("#SBATCH -c 1 -p cpu\n"))
    reasons = {(c.cluster, c.partition): c.reason for c in plan.candidates}
    assert reasons[("alpine", "gpu")] == "the script asks for partition cpu, which this cluster has"
    assert any(c.cluster == "cirrus" and c.feasible for c in plan.candidates)  # elsewhere: placement's choice


def test_a_dependency_on_corral_jobs_pins_their_cluster_and_names_their_slurm_ids():
    jobs = {"c-0123abcd": ("alpine", "17"), "c-ffff0000": ("alpine", "18_3"), "c-1111aaaa": ("borealis", "3"),
            "c-2222bbbb": ("alpine", None)}

    def find(job_id: str) -> tuple[str, str | None]:
        return jobs[job_id]

    task = task_from_script(inline("#SBATCH --dependency=afterok:c-0123abcd:42?afterany:c-ffff0000\n"), "job.sh",
                            find_job=find)
    assert resource_options(task.resources)[0].infra.cluster == "alpine"  # 42 is then alpine's job 42
    assert task.slurm.script.dependencies == {"c-0123abcd": "17", "c-ffff0000": "18_3"}
    for text, message in (("afterok:c-0123abcd:c-1111aaaa", r"run on different clusters \(alpine: c-0123abcd; "
                                                            r"borealis: c-1111aaaa\)"),
                          ("afterok:c-9999ffff", "no job c-9999ffff"),
                          ("afterany:c-2222bbbb", "has not reached its cluster yet")):
        with pytest.raises(ScriptError, match=message):
            task_from_script(inline(f"#SBATCH --dependency={text}\n"), "job.sh", find_job=find)
    with pytest.raises(ScriptError, match="run on alpine, not borealis"):
        task_from_script(inline("#SBATCH -d afterok:c-0123abcd\n"), "job.sh", infra="slurm/borealis", find_job=find)
    parsable = task_from_script(inline("", ("--dependency=afterok:c-0123abcd;alpine",)), "job.sh", find_job=find)
    assert parsable.slurm.script.dependencies == {"c-0123abcd": "17"}  # as `corral sbatch --parsable` printed it
    with pytest.raises(ScriptError, match="c-0123abcd runs on alpine, not borealis"):
        task_from_script(inline("", ("--dependency=afterok:c-0123abcd;borealis",)), "job.sh", find_job=find)


def test_a_dependency_on_slurm_ids_pins_the_cluster_corral_submitted_them_to():
    submitted = {"17": ["alpine"], "18": ["alpine", "borealis"], "19": ["borealis"], "20": ["alpine"]}

    def find(slurm_id: str) -> list[str]:
        return submitted.get(slurm_id, [])

    def cluster_of(dependency: str, infra: str | None = None) -> str:
        task = task_from_script(inline(f"#SBATCH --dependency={dependency}\n"), "job.sh", infra=infra,
                                find_clusters=find)
        return resource_options(task.resources)[0].infra.cluster

    assert cluster_of("afterok:17") == "alpine"
    assert cluster_of("afterok:17:20_3") == "alpine"  # an array task: its array's id
    assert cluster_of("afterany:18,afterok:19") == "borealis"  # 18 is on both; with 19 only borealis fits
    assert cluster_of("afterok:18", infra="slurm/alpine") == "alpine"  # a pin is the user's word
    assert cluster_of("afterok:19", infra="slurm") == "borealis"
    for dependency, message in (("afterok:18", r"more than one cluster \(18 on alpine, borealis\); pin"),
                                ("afterok:17:19", r"on different clusters \(17 on alpine; 19 on borealis\)"),
                                ("afterok:17:99", r"Slurm job 99, which Corral did not submit.*which cluster's job it is")):
        with pytest.raises(ScriptError, match=message):
            cluster_of(dependency)


def test_the_constraint_placement_checks_is_the_one_sbatch_would_use():
    def constraint(text: str, options: tuple[str, ...] = ()) -> str | None:
        return script_constraint(task_from_script(inline(text, options), "job.sh"))

    assert constraint("#SBATCH -C ib -t 5\ntrue\n") == "ib"
    assert constraint("#SBATCH --constraint='ib&hdr'\ntrue\n", ("--constraint=a100",)) == "a100"  # command line wins
    assert constraint("#SBATCH -t 5\ntrue\n") is None
    assert constraint("#SBATCH -C ib\n#SBATCH hetjob\n#SBATCH -C eth\ntrue\n") is None  # each component its own


def test_a_nodelist_keeps_the_script_on_the_partitions_that_hold_its_nodes():
    def planned(job: JobScript, snapshots=SNAPSHOTS):
        task = task_from_script(job, job.file_name)
        options = resource_options(task.resources)
        return script_nodes(script_partitions(build_plan(task, options, snapshots, ORDER), task), task, snapshots)

    plan = planned(inline("#SBATCH -c 1\n", ("-w", "a4")))  # alpine's L4 node, in its inference partition only
    assert [(c.cluster, c.partition) for c in plan.feasible()] == [("alpine", "inference")]
    reasons = {(c.cluster, c.partition): c.reason for c in plan.candidates}
    assert reasons[("alpine", "cpu")] == "--nodelist a4: not a node of this partition"
    assert reasons[("cirrus", "debug")] == "--nodelist a4: no such node on this cluster"
    plan = planned(inline("#SBATCH --nodelist=b[1-2] --gres=gpu:1\n"))
    assert [(c.cluster, c.partition) for c in plan.feasible()] == [("borealis", "h100-cluster")]
    job = inline("#SBATCH -c 1 -p gpu -w a1\n")  # a1 has free H100s and CPUs: it can start now...
    assert [(c.cluster, c.partition, c.startable_now) for c in planned(job).feasible()][0] == ("alpine", "gpu", True)
    alpine = SNAPSHOTS["alpine"]
    nodes = tuple(replace(n, usable=False, state="drained") if n.name == "a1" else n for n in alpine.nodes)
    drained = {**SNAPSHOTS, "alpine": replace(alpine, nodes=nodes)}  # ...until a1 is drained, a2 being free or not
    assert not [c for c in planned(job, drained).feasible() if c.cluster == "alpine"][0].startable_now
    assert len(planned(inline("#SBATCH -c 1 -w ./hosts.txt\n")).feasible()) > 1  # a file of names: Slurm's to read
    with pytest.raises(ScriptError, match=r"job.sh:2 --nodelist=a\[1-: a '\[' is not closed"):
        planned(inline("#SBATCH --nodelist=a[1-\n"))


def test_excluded_nodes_are_not_counted_where_the_script_may_go():
    """`-x a1`: alpine's only free H100s are on a1, so alpine cannot start it now; `-x b[1-2]` leaves
    borealis's h100-cluster no node at all."""
    def planned(job: JobScript):
        task = task_from_script(job, job.file_name)
        snapshots = without_excluded(task, SNAPSHOTS)
        plan = script_partitions(build_plan(task, resource_options(task.resources), snapshots, ORDER), task)
        return script_nodes(plan, task, SNAPSHOTS)

    job = inline("#SBATCH --gres=gpu:h100:1 -p gpu\n")
    assert [(c.cluster, c.startable_now) for c in planned(job).feasible()][0] == ("alpine", True)
    excluded = planned(inline("#SBATCH --gres=gpu:h100:1 -p gpu\n", ("-x", "a1")))
    assert ("alpine", "gpu", False) in [(c.cluster, c.partition, c.startable_now) for c in excluded.feasible()]
    walled = planned(inline("#SBATCH --gres=gpu:h100:1 --exclude=b[1-2]\n"))
    reasons = {(c.cluster, c.partition): c.reason for c in walled.candidates}
    assert not any(c.cluster == "borealis" and c.partition == "h100-cluster" for c in walled.feasible())
    assert reasons[("borealis", "h100-cluster")] == "--exclude leaves this partition no node"
    assert reasons[("cirrus", "maint")] == "partition has no nodes"  # it had none to begin with
    unchanged = inline("#SBATCH -c 1 -x ./hosts.txt\n")  # a file of names: Slurm's to read
    task = task_from_script(unchanged, "job.sh")
    assert without_excluded(task, SNAPSHOTS) == SNAPSHOTS
