"""A user's job script as each testbed cluster receives it (golden files), changed only in the
directives Corral rewrites; its submission, its status whatever its name, and its log's path."""

from __future__ import annotations

import difflib

import pytest

from corral.infra.base import JobRequest
from corral.infra.slurm import userscript
from corral.infra.slurm import jobs
from corral.infra.slurm.jobs import follow_script, parse_status
from corral.sbatch_script import read_script
from tests.conftest import FIXTURES
from tests.infra.slurm.test_jobscript import check_golden

REWRITTEN = {"partition", "gres", "gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket", "account", "qos",
             "array"}
# (corpus script, cluster, partition, the site's GRES type for the task's GPU, profile account, profile QOS)
TARGETS = [
    ("single_gpu", "alpine", "gpu", "nvidia_h100_80gb_hbm3", None, None),
    ("single_gpu", "borealis", "h100-cluster", "H100", "research", None),
    ("mpi_multinode", "cirrus", "b300", None, None, "high"),
    ("array", "alpine", "cpu", None, None, None),
    ("gpus_per_node", "alpine", "inference", "nvidia_l4", None, None),
    ("het_mem_per_cpu", "borealis", "h100-cluster", None, "research", "normal"),
    ("modules", "cirrus", "debug", None, None, None),
]


def request(name: str, partition: str, gres_type: str | None, account: str | None = None, qos: str | None = None,
            options: tuple[str, ...] = (), copies: tuple[int, ...] = (), **extra) -> JobRequest:
    text = (FIXTURES / "scripts" / f"{name}.sh").read_text()
    scheduler = {"script": {"text": text, "file_name": f"{name}.sh", "options": list(options), "args": ["--seed", "1 2"]}}
    if account:
        scheduler["account"] = account
    if qos:
        scheduler["qos"] = qos
    ids = tuple(f"c-{i:012x}" for i in range(len(copies) or 1))
    base = dict(token="0123456789ab", task_ids=ids, place=partition, num_nodes=1, accelerator_type=gres_type,
                accelerators_per_node=1 if gres_type else 0, cpus_per_node=None, memory_mb=None,
                envs={"LR": "0.001 0.01"}, setup=None, run=None, scheduler_options=scheduler, copy_indices=copies)
    base.update(extra)
    return JobRequest(**base)


def changed_options(before: str, after: str) -> set[str]:
    """The options whose value differs (or that appear) between two scripts; and every line that is not
    a directive must be the same, in the same order."""
    old, new = read_script(before), read_script(after)
    assert [line for line in before.splitlines() if not line.startswith("#SBATCH")] == [
        line for line in after.splitlines() if not line.startswith("#SBATCH")]
    seen = {(o.component, o.name, o.value) for o in old.directives}
    return {o.name for o in new.directives if (o.component, o.name, o.value) not in seen}


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"{t[0]}-{t[1]}")
def test_each_cluster_receives_the_script_with_only_its_site_specific_options_rewritten(target):
    name, cluster, partition, gres_type, account, qos = target
    original = (FIXTURES / "scripts" / f"{name}.sh").read_text()
    submission = userscript.submission_for(request(name, partition, gres_type, account, qos), cluster)
    check_golden(f"scripts/{name}.{cluster}.sh", submission.text)
    assert changed_options(original, submission.text) <= REWRITTEN
    for line in difflib.ndiff(original.splitlines(), submission.text.splitlines()):
        if line.startswith(("- ", "+ ")):
            assert line[2:].startswith("#SBATCH "), line


def test_what_is_rewritten_and_where():
    text = userscript.submission_for(request("single_gpu", "h100-cluster", "H100", "research"), "borealis").text
    assert "#SBATCH --partition=h100-cluster\n" in text and "#SBATCH --gres=gpu:H100:1          # one H100\n" in text
    assert "#SBATCH --account=research\n" in text  # written nowhere: a new line after the last directive
    het = userscript.submission_for(request("het_mem_per_cpu", "b300", None, qos="high"), "cirrus").text
    lines = het.splitlines()
    # Written nowhere: both go to the first component, which the second inherits them from.
    assert lines.index("#SBATCH --partition=b300") < lines.index("#SBATCH hetjob")
    assert lines.index("#SBATCH --qos=high") < lines.index("#SBATCH hetjob")


def test_the_command_line_is_rewritten_where_it_sets_an_option():
    submission = userscript.submission_for(
        request("single_gpu", "h100-cluster", "H100", options=("-p", "gpu", "--gres=gpu:h100:2", "--exclusive")),
        "borealis")
    assert submission.user_options == ("-p", "h100-cluster", "--gres=gpu:H100:2", "--exclusive")
    assert "#SBATCH --partition=gpu\n" in submission.text  # overridden by the command line: left as written
    assert submission.command() == (
        "sbatch --parsable -p h100-cluster --gres=gpu:H100:2 --exclusive --comment=corral-0123456789ab "
        "--chdir=$HOME/.corral/runs/0123456789ab/workdir ./single_gpu.sh --seed '1 2'")
    mine = userscript.submission_for(request("modules", "debug", None, options=("--comment=mine",)), "cirrus")
    assert mine.command().index("--comment=mine") < mine.command().index("--comment=corral-")  # Corral's wins


def test_a_managed_resubmission_of_some_array_tasks():
    submission = userscript.submission_for(request("array", "cpu", None, copies=(2, 6)), "alpine")
    assert "#SBATCH --array=2,6%2\n" in submission.text
    whole = userscript.submission_for(request("array", "cpu", None, copies=(0, 2, 4, 6)), "alpine")
    assert "#SBATCH --array=0-6:2%2\n" in whole.text  # the whole array: left as written
    assert whole.log_paths == tuple(f".corral/runs/0123456789ab/workdir/sweep_%A_{i}.log" for i in (0, 2, 4, 6))


def test_the_submission_is_idempotent_by_its_comment_and_keeps_values_whole():
    script = userscript.submit_script(request("single_gpu", "gpu", "nvidia_h100_80gb_hbm3", requeue=False,
                                              held=True), "alpine")
    assert "-o '%F|%k'" in script and "-v c=corral-0123456789ab '$2 == c" in script
    assert '--chdir="$HOME"/.corral/runs/0123456789ab/workdir --no-requeue --hold' in script
    assert "single_gpu.sh --seed '1 2'" in script
    env = userscript.environment(request("single_gpu", "gpu", None, extra_env={"CORRAL_MANAGED": "1"}), "alpine")
    assert "export LR='0.001 0.01'\n" in env and "export CORRAL_TASK_ID=c-000000000000\n" in env
    assert "export CORRAL_MANAGED=1\n" in env and "SLURM_" not in env


def test_a_script_is_predicted_as_it_would_be_submitted():
    script = jobs.test_only_script([request("modules", "debug", None)], "cirrus")
    assert "sbatch --test-only  ./job" in script and "#SBATCH --partition=debug" in script


def test_status_finds_script_jobs_by_their_comment_whatever_their_name():
    statuses = {s.handle: s for s in parse_status("alpine", (FIXTURES / "jobs" / "alpine-script-status.txt").read_text())}
    assert statuses["26"].token == "53b451557c52" and statuses["26"].state == "RUNNING"  # named "a|b c"
    assert statuses["29"].reason == "JobHeldUser" and statuses["29"].token == "683d3a12e35e"
    assert statuses["18_4"].token == "5631b53a9317"
    assert statuses["22"].token == "a280348ca19d"  # Corral's own job: the token in its name, no comment
    # A heterogeneous job is its first component, under sbatch's id.
    assert statuses["27"].state == "PENDING" and "27+1" not in statuses and "27+0" not in statuses


def test_an_error_file_apart_from_the_output_is_recorded_per_copy_and_only_then():
    work = ".corral/runs/0123456789ab/workdir"
    plain = userscript.submission_for(request("single_gpu", "gpu", None), "alpine")
    assert (plain.log_paths, plain.error_paths) == ((f"{work}/single-gpu-%j.out",), ())  # stderr in the log
    mpi = userscript.submission_for(request("mpi_multinode", "b300", None), "cirrus")
    assert (mpi.log_paths, mpi.error_paths) == ((f"{work}/mpi-%j.out",), (f"{work}/mpi-%j.err",))
    given = userscript.submission_for(request("single_gpu", "gpu", None, options=("-e", "logs/%x-%j.err")), "alpine")
    assert given.error_paths == (f"{work}/logs/single-gpu-%j.err",)  # the command line's, %x filled in
    same = userscript.submission_for(request("single_gpu", "gpu", None, options=("--error=%x-%j.out",)), "alpine")
    assert same.error_paths == ()  # the output's own file: nothing apart
    array = userscript.submission_for(request("array", "cpu", None, options=("--error=/scratch/%A_%a.err",),
                                              copies=(0, 3)), "alpine")
    assert array.error_paths == ("/scratch/%A_0.err", "/scratch/%A_3.err")


def test_log_paths_fill_the_output_pattern():
    assert follow_script(".corral/runs/t/workdir/sweep_%A_4.log", "18_4", False).splitlines()[1] == (
        'find_log() { set -- "$HOME"/.corral/runs/t/workdir/sweep_18_4.log; f="${1-}"; }')
    assert userscript.log_glob("/scratch/%u/%x-%5j.%N.out", "42") == "/scratch/\"$(id -un)\"/*-00042.*.out"
    assert userscript.log_glob("out-%j-%%.txt", "7") == '"$HOME"/out-7-%.txt'


def test_a_dependency_on_corral_jobs_becomes_their_slurm_ids():
    text = "#!/bin/bash\n#SBATCH --dependency=afterok:c-0123abcd:42,singleton -t 5\ntrue\n"
    rewritten, words = userscript.rewrite(text, ["-d", "afterany:c-ffff0000"], partition="cpu", gpu_type=None,
                                          account=None, qos=None,
                                          dependencies={"c-0123abcd": "17", "c-ffff0000": "18_3"})
    assert words == ["-d", "afterany:18_3"]  # the command line's wins, so it is the one rewritten
    assert "#SBATCH --dependency=afterok:c-0123abcd:42,singleton -t 5\n" in rewritten
    rewritten, _ = userscript.rewrite(text, [], partition="cpu", gpu_type=None, account=None, qos=None,
                                      dependencies={"c-0123abcd": "17"})
    assert "#SBATCH --dependency=afterok:17:42,singleton -t 5\n" in rewritten
    _, words = userscript.rewrite(text, ["--dependency=afterok:c-0123abcd;alpine:c-ffff0000"], partition="cpu",
                                  gpu_type=None, account=None, qos=None,
                                  dependencies={"c-0123abcd": "17", "c-ffff0000": "18_3"})
    assert words == ["--dependency=afterok:17:18_3"]  # `--parsable`'s c-…;cluster: the cluster is dropped


def test_the_folders_of_the_log_files_are_made_before_sbatch():
    """`-o logs/%x-%j.out` beside a logs/ folder works with sbatch; the job starts in a folder of its own,
    where Slurm would fail it (JobLaunchFailure) for want of logs/."""
    text = "#!/bin/bash\n#SBATCH -o logs/%x-%j.out -e /scratch/me/err/%j.err\n#SBATCH --chdir=work\ntrue\n"
    options = userscript._effective(text, [])
    assert userscript.log_folders(options, ".corral/runs/t0") == [".corral/runs/t0/workdir/work/logs",
                                                                  "/scratch/me/err"]  # --chdir: from the workdir
    assert userscript.log_folders(userscript._effective("#!/bin/bash\n#SBATCH -o %u/%j.out -e e.err\n", []),
                                  ".corral/runs/t0") == []  # a folder a pattern names, or none: left alone
