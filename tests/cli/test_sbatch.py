"""`corral sbatch` on the real testbed: job scripts in the shapes HPC centres document run unchanged on the
cluster placement picks, with their output where their --output pattern says; the dry run shows each
cluster's script as a diff; what cannot be routed says why; queue, logs, cancel and managed runs work
as for any task."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys

from tests.conftest import FIXTURES, wait_for
from tests.helpers import ssh_login

CORPUS = ("single_gpu", "mpi_multinode", "array", "gpus_per_node", "het_mem_per_cpu", "modules")
# What each script prints (its --output file), whichever cluster it lands on.
EXPECTED = {
    "single_gpu": r"single-gpu on \w+ in (gpu|h100-cluster) gpus=\S+ task=c-\w+\nargs: --flag value",
    "mpi_multinode": r"rank 0 of 4 on (\w+)\nrank 1 of 4 on \1\nrank 2 of 4 on (?!\1)\w+\nrank 3 of 4 on \w+\n"
                     r"nodes: 2 \(",
    "array": r"task \d of array \d+ on (alpine|borealis|cirrus)",
    "gpus_per_node": r"inference on a4: nvidia_l4:1 gpus, 2 cpus per gpu",
    "het_mem_per_cpu": r"coordinator on \w+ mem_per_cpu=2000\nworker 0 on \w+\nworker 1 on \w+",
    "modules": r"cuda=12\.\d on (alpine|borealis|cirrus) \(\1\)",
}


def log_file(submitted: dict, index: int) -> str:
    """Where the script's --output pattern puts copy `index`'s output, filled in as Slurm fills it (Corral
    recorded the first copy's, with %a filled in)."""
    handle = submitted["handles"][index]
    base, _, task = handle.partition("_")
    if task:  # an array task: the script's pattern is sweep_%A_%a.log
        return submitted["log_path"].rpartition("/")[0] + f"/sweep_{base}_{task}.log"
    return submitted["log_path"].replace("%j", handle)


def test_the_corpus_runs_unchanged_where_placement_puts_it(corral, testbed, clean_queues, tmp_path):
    for name in CORPUS:
        shutil.copy(FIXTURES / "scripts" / f"{name}.sh", tmp_path / f"{name}.sh")
    submitted = {}
    for name in CORPUS:
        args = ["--flag", "value"] if name == "single_gpu" else []
        result = corral("sbatch", "--json", f"{name}.sh", *args, cwd=tmp_path)
        assert result.exit_code == 0, f"{name}: {result.stderr}"
        submitted[name] = result.json()
        if name == "array":  # one Corral job per array task, under the user's own indices
            assert [h.rpartition("_")[2] for h in submitted[name]["handles"]] == ["0", "2", "4", "6"]
    assert submitted["gpus_per_node"]["partition"] == "inference"  # the only L4s

    def ended() -> list[dict] | None:
        jobs = corral("queue", "--json", "--all").json()
        return jobs if all(j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") for j in jobs) else None

    jobs = {j["job_id"]: j for j in wait_for("the scripts to end", ended, timeout=90)}
    for name, share in submitted.items():
        for index, job_id in enumerate(share["job_ids"]):
            assert jobs[job_id]["state"] == "SUCCEEDED", (name, jobs[job_id])
            where = log_file(share, index)
            text = ssh_login(testbed.cluster_config, share["cluster"], f'cat "$HOME"/{where}')
            assert re.search(EXPECTED[name], text), (name, where, text)
            assert corral("logs", job_id).stdout == text  # Corral's logs read the same file
    ran = ssh_login(testbed.cluster_config, submitted["single_gpu"]["cluster"],
                    f"scontrol show job {submitted['single_gpu']['slurm_job_id']} 2>/dev/null || true")
    assert not ran or "JobName=single-gpu" in ran  # the script's own name, not Corral's


def test_the_dry_run_shows_each_clusters_script_as_a_diff(corral, tmp_path):
    script = tmp_path / "single_gpu.sh"
    shutil.copy(FIXTURES / "scripts" / "single_gpu.sh", script)
    shown = corral("sbatch", "--dryrun", str(script))
    assert shown.exit_code == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "-#SBATCH --partition=gpu" in lines and "+#SBATCH --partition=h100-cluster" in lines
    assert "+#SBATCH --gres=gpu:H100:1          # one H100" in shown.stdout
    assert "+#SBATCH --gres=gpu:nvidia_h100_80gb_hbm3:1          # one H100" in shown.stdout
    rows = {r["infra"]: r for r in corral("sbatch", "--dryrun", "--json", str(script)).json()}
    assert rows["slurm/alpine/gpu"]["sbatch_command"].endswith("single_gpu.sh")
    assert "script_diff" not in rows["slurm/cirrus/b300"] and not rows["slurm/cirrus/b300"]["feasible"]

    pinned = corral("sbatch", "--dryrun", "--json", "-p", "debug", "-c", "1", "--gres=gpu:1", str(script))
    feasible = [r["infra"] for r in pinned.json() if r["feasible"]]
    assert feasible == ["slurm/cirrus/debug"]  # a partition only cirrus has, pinned on the command line
    assert {r["reason"] for r in pinned.json() if r["infra"] == "slurm/alpine/gpu"} == {
        "the command line pins --partition=debug"}


def test_what_cannot_be_routed_says_why(corral, tmp_path):
    script = tmp_path / "elsewhere.sh"
    script.write_text("#!/bin/bash\n#SBATCH -M otherdomain\n#SBATCH -t 5\ntrue\n")
    refused = corral("sbatch", str(script))
    assert refused.exit_code == 65 and "elsewhere.sh:2 -M: the script names Slurm clusters" in refused.stderr
    script.write_text("#!/bin/bash\n#SBATCH --dependency=afterok:12345\ntrue\n")
    refused = corral("sbatch", str(script))
    assert refused.exit_code == 65 and "12345, which Corral did not submit" in refused.stderr
    assert "--infra slurm/<cluster>" in refused.stderr
    script.write_text("#!/bin/bash\n#SBATCH --nodes=many\ntrue\n")
    refused = corral("launch", str(script))  # recognised as a script by `corral launch` too
    assert refused.exit_code == 65 and "elsewhere.sh:2 --nodes=many: expected a count" in refused.stderr
    for result in (corral("sbatch", "--infra"), corral("sbatch", "-p", "gpu"), corral("sbatch", str(tmp_path / "no.sh"))):
        assert result.exit_code != 0 and "Traceback" not in result.stderr and "corral: error:" in result.stderr


def test_a_wrapped_command_runs_in_the_script_sbatch_would_write(corral, testbed, clean_queues, tmp_path):
    """`sbatch --wrap CMD`, as Slurm users type it: the job's script is sbatch's own sh wrapper, its name
    "wrap", and options before and after --wrap still count."""
    submitted = corral("sbatch", "--json", "--infra", "slurm/alpine/cpu", "-c", "1", "--wrap",
                       'echo "$SLURM_JOB_NAME $FOO"; sed -n 2p "$0"',
                       "--export=ALL,FOO=bar", "-t", "5", cwd=tmp_path)
    assert submitted.exit_code == 0, submitted.stderr
    job = submitted.json()
    wait_for("the wrapped command to end", lambda: {j["job_id"]: j for j in corral("queue", "--json", "--all").json()}[
        job["job_id"]]["state"] == "SUCCEEDED", timeout=60)
    assert corral("logs", job["job_id"]).stdout == "wrap bar\n#SBATCH --partition=cpu\n"  # Corral's one change
    tested = corral("sbatch", "--json", "--test-only", "-c", "1", "--wrap", "true", cwd=tmp_path)  # sbatch's dry run
    assert tested.exit_code == 0 and tested.json()[0]["sbatch_command"].endswith(" ./wrap"), tested.stderr
    both = corral("sbatch", "--wrap", "true", "job.sh", cwd=tmp_path)
    assert both.exit_code == 65 and "Script arguments not permitted with --wrap" in both.stderr
    inside = tmp_path / "inside.sh"
    inside.write_text("#!/bin/bash\n#SBATCH --wrap=true\ntrue\n")
    refused = corral("sbatch", str(inside))
    assert refused.exit_code == 65 and "inside.sh:2 --wrap: --wrap replaces the script" in refused.stderr


def test_a_script_on_standard_input_runs_as_sbatch_would_run_it(corral_env, testbed, clean_queues, tmp_path):
    """`corral sbatch < job.sh` or a here document, as sbatch reads one: the job is named "sbatch" (and so
    is its file on the cluster, which sbatch must not take for itself from PATH)."""
    script = "#!/bin/bash\n#SBATCH -c 1 -t 5\necho \"$SLURM_JOB_NAME ran $1\"\n"
    ran = subprocess.run([sys.executable, "-m", "corral", "sbatch", "--infra", "slurm/alpine/cpu", "-W"],
                         input=script, capture_output=True, text=True, env=corral_env, cwd=tmp_path, timeout=90)
    assert ran.returncode == 0, ran.stderr
    job_id = ran.stdout.split()[3]
    logs = subprocess.run([sys.executable, "-m", "corral", "logs", job_id], capture_output=True, text=True,
                          env=corral_env, timeout=30)
    assert logs.stdout == "sbatch ran \n"
    for given, error in (("", "standard input was empty"), ("echo hi\n", "starts with a '#!' line")):
        refused = subprocess.run([sys.executable, "-m", "corral", "sbatch"], input=given, capture_output=True,
                                 text=True, env=corral_env, cwd=tmp_path, timeout=30)
        assert refused.returncode == 65 and error in refused.stderr, refused.stderr
    misplaced = subprocess.run([sys.executable, "-m", "corral", "sbatch", "-W", "--infra", "slurm/alpine", "x.sh"],
                               capture_output=True, text=True, env=corral_env, timeout=30)
    assert misplaced.returncode == 65 and "--infra is Corral's option: give it before the sbatch options" in \
        misplaced.stderr


def test_wait_returns_when_the_job_ends_with_its_exit_code(corral, corral_env, testbed, clean_queues, tmp_path):
    """`sbatch -W`: the job's exit code (an array's highest); Ctrl-C stops waiting, not the job."""
    failed = corral("sbatch", "--infra", "slurm/alpine/cpu", "-W", "--wrap", "exit 3", cwd=tmp_path)
    assert failed.exit_code == 3, failed.stderr
    assert re.fullmatch(r"corral: c-\w+ FAILED on slurm/alpine/cpu \(exit code 3\)\n", failed.stderr)
    script = tmp_path / "mixed.sh"
    script.write_text("#!/bin/bash\n#SBATCH --array=0-2 -c 1 -t 5\nexit $SLURM_ARRAY_TASK_ID\n")
    array = corral("sbatch", "-t", "5", "--wait", str(script), cwd=tmp_path)
    assert array.exit_code == 2, array.stderr
    assert "3 jobs ended: 2 FAILED, 1 SUCCEEDED; highest exit code 2" in array.stderr
    assert all(j["state"] != "RUNNING" for j in corral("queue", "--json").json())
    script.write_text("#!/bin/bash\n#SBATCH -W\ntrue\n")
    refused = corral("sbatch", str(script))
    assert refused.exit_code == 65 and "mixed.sh:2 -W: give -W/--wait on corral sbatch's command line" in refused.stderr

    proc = subprocess.Popen([sys.executable, "-m", "corral", "sbatch", "-W", "--wrap", "sleep 300"],
                            env=corral_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        [job_id] = wait_for("the job to run", lambda: [j["job_id"] for j in corral("queue", "--json").json()
                                                       if j["state"] == "RUNNING"], 60)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130 and out.startswith(f"Submitted batch job {job_id} "), (out, err)
    assert f"{job_id} keeps running; Ctrl-C only stopped waiting. `corral cancel {job_id}` stops it" in err
    assert "Traceback" not in err
    assert {j["job_id"]: j["state"] for j in corral("queue", "--json").json()}[job_id] == "RUNNING"
    assert corral("cancel", job_id).exit_code == 0


def test_the_slurm_job_id_names_a_job_and_an_array_id_all_its_tasks(corral, testbed, clean_queues, tmp_path):
    """As with squeue and scancel: `corral logs 4711`, `corral cancel 4711` for a whole array."""
    one = corral("sbatch", "--json", "--infra", "slurm/alpine/cpu", "-c", "1", "--wrap", "echo one; sleep 300",
                 cwd=tmp_path).json()
    array = corral("sbatch", "--json", "--infra", "slurm/alpine/cpu", "--array=0-2", "--hold", "--wrap", "true",
                   cwd=tmp_path).json()
    wait_for("the job to print", lambda: corral("logs", "--no-follow", one["slurm_job_id"]).stdout == "one\n", 60)
    assert f"{one['job_id']}: cancelled" in corral("cancel", one["slurm_job_id"]).stdout
    cancelled = corral("cancel", array["slurm_job_id"])
    assert cancelled.exit_code == 0 and sorted(re.findall(r"(c-\w+): cancelled", cancelled.stdout)) == sorted(
        array["job_ids"])
    row = corral("queue").stdout.splitlines()[1]
    assert f"{array['job_ids'][0]} (sweep)" in row and f" {array['slurm_job_id']} " in row


def test_a_managed_array_is_one_managed_job_per_task(corral, testbed, clean_queues, tmp_path):
    """`corral sbatch --managed` of an array recorded one managed job, and only task 0 ever ran."""
    ran = corral("sbatch", "--managed", "--infra", "slurm/alpine/cpu", "--parsable", "-W", "--array=0-2", "--wrap",
                 "echo t$SLURM_ARRAY_TASK_ID; exit $SLURM_ARRAY_TASK_ID", cwd=tmp_path, timeout=120)
    assert ran.exit_code == 2, ran.stderr  # the highest of the tasks' exit codes, as sbatch -W
    ids = ran.stdout.split()
    assert len(ids) == 3 and "3 jobs ended: 2 FAILED, 1 SUCCEEDED" in ran.stderr
    rows = {r["job_id"]: r for r in corral("jobs", "queue", "--json").json()}
    handles = sorted(rows[i]["slurm_job_id"] for i in ids)
    assert len({h.partition("_")[0] for h in handles}) == 1  # one Slurm array
    assert [h.partition("_")[2] for h in handles] == ["0", "1", "2"]
    assert [corral("jobs", "logs", "--no-follow", i).stdout.splitlines()[-1] for i in ids] == ["t0", "t1", "t2"]
    shown = corral("sbatch", "--managed", "--infra", "slurm/alpine/cpu", "--array=0-1", "--wrap", "true", cwd=tmp_path)
    assert re.fullmatch(r"Submitted managed jobs c-\w+\.\.c-\w+ \(2 array tasks\)\n", shown.stdout), shown.stderr
    as_json = corral("sbatch", "--managed", "--json", "--infra", "slurm/alpine/cpu", "--wrap", "true", cwd=tmp_path)
    assert as_json.json()["job_ids"] == [as_json.json()["job_id"]]  # JSON, as `corral jobs launch --json`


def test_a_log_folder_and_the_submit_folder_are_where_the_script_expects(corral, corral_env, testbed, clean_queues,
                                                                          tmp_path):
    """`#SBATCH -o logs/%x-%j.out`: with sbatch it works beside a logs/ folder; the job failed with
    Slurm's JobLaunchFailure, as it starts in a folder of its own. Its `-e` file is read with `--stderr`
    (nothing showed it before: a failed script's traceback was nowhere in `corral logs`)."""
    script = tmp_path / "logged.sh"
    script.write_text("#!/bin/bash\n#SBATCH -o logs/%x-%j.out -e errors/%j.err -c 1 -t 5\n"
                      "cd \"$SLURM_SUBMIT_DIR\" && cat data.txt; echo err >&2\n")
    (tmp_path / "sent").mkdir()
    (tmp_path / "sent" / "data.txt").write_text("data\n")
    ran = corral("sbatch", "--infra", "slurm/alpine/cpu", "--workdir", "sent", "-W", str(script), cwd=tmp_path,
                 timeout=90)
    assert ran.exit_code == 0, ran.stderr
    # and SLURM_SUBMIT_DIR is where the files sent with it are, as where the user runs sbatch
    assert corral("logs", "--no-follow", ran.stdout.split()[3]).stdout == "data\n"
    assert corral("logs", "--no-follow", "--stderr", ran.stdout.split()[3]).stdout == "err\n"
    script.write_text("#!/bin/bash\n#SBATCH -o %j.out -e %j.err -c 1 -t 5\necho doing; echo Traceback >&2; exit 4\n")
    failed = corral("sbatch", "--infra", "slurm/alpine/cpu", "-W", str(script), cwd=tmp_path, timeout=90)
    job_id = failed.stdout.split()[3]
    hint = f"; its stderr is in a file of its own: `corral logs --stderr {job_id}`\n"
    assert failed.exit_code == 4 and failed.stderr.endswith(f"(exit code 4){hint}"), failed.stderr
    followed = corral("logs", job_id)
    assert (followed.exit_code, followed.stdout) == (4, "doing\n") and followed.stderr.endswith(hint)
    errors = corral("logs", "--stderr", job_id)
    assert (errors.exit_code, errors.stdout) == (4, "Traceback\n") and "--stderr" not in errors.stderr
    saved = corral("logs", "--sync-down", job_id, env={**corral_env, "HOME": str(tmp_path)})
    assert saved.stdout.split() == [str(tmp_path / "corral_logs" / job_id / f"run.{end}") for end in ("log", "err")]
    assert (tmp_path / "corral_logs" / job_id / "run.err").read_text() == "Traceback\n"
    managed = corral("sbatch", "--infra", "slurm/alpine/cpu", "--managed", "-W", str(script), cwd=tmp_path, timeout=90)
    managed_id = managed.stdout.split()[-1]
    told = corral("jobs", "logs", managed_id)  # the managed job's end line says so too
    assert (told.exit_code, told.stdout) == (4, "doing\n") and told.stderr.endswith(
        f"; its stderr is in a file of its own: `corral logs --stderr {managed_id}`\n"), told.stderr
    (tmp_path / "sent" / "sub").mkdir()
    script.write_text("#!/bin/bash\n#SBATCH -D sub -o out-%j.txt -c 1 -t 5\npwd\n")  # -D: from the submit folder
    ran = corral("sbatch", "--infra", "slurm/alpine/cpu", "--workdir", "sent", "-W", str(script), cwd=tmp_path,
                 timeout=90)
    assert ran.exit_code == 0, ran.stderr
    assert corral("logs", "--no-follow", ran.stdout.split()[3]).stdout.endswith("/workdir/sub\n")
    none_apart = corral("logs", "--stderr", "--no-follow", ran.stdout.split()[3])
    assert none_apart.exit_code == 66 and "has no stderr file of its own: its stderr is in its output" in (
        none_apart.stderr)


def test_excluded_and_listed_nodes_steer_the_plan(corral):
    plan = corral("sbatch", "--dryrun", "--json", "-x", "a[1-2]", "--gres=gpu:h100:1", "--wrap", "true").json()
    rows = {r["infra"]: r for r in plan}
    assert rows["slurm/alpine/gpu"]["reason"] == "-x leaves this partition no node"
    assert [r["infra"] for r in plan if r["feasible"]] == ["slurm/borealis/h100-cluster"]
    plan = corral("sbatch", "--dryrun", "--json", "-w", "a4", "--wrap", "true").json()
    assert [r["infra"] for r in plan if r["feasible"]] == ["slurm/alpine/inference"]
    assert {r["infra"]: r["reason"] for r in plan}["slurm/cirrus/debug"] == "--nodelist a4: no such node on this cluster"


def test_a_constraint_goes_where_nodes_have_the_features(corral, testbed, clean_queues, tmp_path):
    """Only borealis's H100 nodes carry the feature ib: the plan says so of every other place, the script
    lands there, and a task file's slurm.constraint is read the same way."""
    script = tmp_path / "ib.sh"
    script.write_text("#!/bin/bash\n#SBATCH --gres=gpu:h100:1 --constraint=ib\n#SBATCH -t 5 -o ib-%j.out\n"
                      "echo on $SLURMD_NODENAME\n")
    rows = {r["infra"]: r for r in corral("sbatch", "--dryrun", "--json", str(script)).json()}
    assert [infra for infra, r in rows.items() if r["feasible"]] == ["slurm/borealis/h100-cluster"]
    assert rows["slurm/alpine/gpu"]["reason"] == "no node matches --constraint=ib (its nodes have no features)"
    submitted = corral("sbatch", "--json", str(script))
    assert submitted.exit_code == 0, submitted.stderr
    job = submitted.json()
    assert job["cluster"] == "borealis"
    wait_for("the script to end", lambda: {j["job_id"]: j for j in corral("queue", "--json", "--all").json()}[
        job["job_id"]]["state"] == "SUCCEEDED", timeout=60)
    assert corral("logs", job["job_id"]).stdout in ("on b1\n", "on b2\n")

    task = tmp_path / "task.yaml"
    task.write_text("resources: {accelerators: H100:1}\nslurm: {constraint: ib|hdr}\nrun: hostname\n")
    rows = {r["infra"]: r for r in corral("launch", "--dryrun", "--json", str(task)).json()}
    assert [infra for infra, r in rows.items() if r["feasible"]] == ["slurm/borealis/h100-cluster"]
    assert rows["slurm/alpine/cpu"]["reason"] == "no H100 GPUs (has no GPUs)"  # the GPU type is said first


def test_launch_cancel_and_a_managed_run_of_a_script(corral, testbed, clean_queues, tmp_path):
    script = tmp_path / "long.sh"
    script.write_text("#!/bin/bash\n#SBATCH --job-name=long-one\n#SBATCH -c 1 -t 5\necho started; sleep 300\n")
    launched = corral("launch", "-d", "--json", str(script))
    assert launched.exit_code == 0, launched.stderr
    job = launched.json()
    wait_for("the script to start", lambda: corral("logs", "--no-follow", job["job_id"]).stdout == "started\n", timeout=30)
    squeue = ssh_login(testbed.cluster_config, job["cluster"], "squeue --me -h -o '%i %j %k'")
    assert f"{job['slurm_job_id']} long-one corral-" in squeue  # its own name; Corral's token in its comment
    assert "cancelled" in corral("cancel", job["job_id"]).stdout
    wait_for("Slurm to end it", lambda: job["slurm_job_id"] not in ssh_login(
        testbed.cluster_config, job["cluster"], "squeue --me -h -t R,PD -o %i").split())

    script.write_text("#!/bin/bash\n#SBATCH -c 1 -t 5\necho managed $CORRAL_TASK_ID\n")
    managed = corral("sbatch", "--managed", str(script))
    assert managed.exit_code == 0, managed.stderr
    job_id = managed.stdout.split()[-1]

    def succeeded() -> bool:
        rows = json.loads(corral("jobs", "queue", "--json").stdout)
        return any(r["job_id"] == job_id and r["state"] == "SUCCEEDED" for r in rows)

    wait_for("the managed script to succeed", succeeded, timeout=60)
    assert corral("jobs", "logs", job_id).stdout == f"managed {job_id}\n"


def test_a_pipeline_of_scripts_waits_on_the_cluster_of_the_job_it_depends_on(corral, testbed, clean_queues, tmp_path):
    first = tmp_path / "prepare.sh"
    first.write_text("#!/bin/bash\n#SBATCH -c 1 -t 5 -o prepare.out\nsleep 3; echo prepared\n")
    second = tmp_path / "train.sh"
    second.write_text("#!/bin/bash\n#SBATCH -c 1 -t 5 -o train.out\necho trained\n")
    prepared = corral("sbatch", "--json", "--infra", "slurm/borealis", str(first))
    assert prepared.exit_code == 0, prepared.stderr
    before = prepared.json()
    parsable = corral("sbatch", "--infra", "slurm/borealis", "--parsable", "--wrap", "true").stdout.strip()
    assert parsable.endswith(";borealis")  # as `sbatch -M` prints jobid;cluster, and dependencies take it
    trained = corral("sbatch", "--json", f"--dependency=afterok:{before['job_id']}:{parsable}", str(second))
    assert trained.exit_code == 0, trained.stderr
    after = trained.json()
    assert after["cluster"] == "borealis"  # where the job it waits for runs: nothing pinned it but the dependency
    squeue = ssh_login(testbed.cluster_config, "borealis", f"squeue -h -j {after['slurm_job_id']} -o '%E %r'")
    assert f"afterok:{before['slurm_job_id']}" in squeue
    by_slurm_id = corral("sbatch", "--json", f"--dependency=afterany:{before['slurm_job_id']}", "--wrap", "true")
    assert by_slurm_id.exit_code == 0, by_slurm_id.stderr
    assert by_slurm_id.json()["cluster"] == "borealis"  # a bare Slurm id: the cluster Corral submitted it to

    def ended() -> list[dict] | None:
        jobs = {j["job_id"]: j for j in corral("queue", "--json", "--all").json()}
        return jobs if jobs[after["job_id"]]["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") else None

    jobs = wait_for("the dependent script to run", ended, timeout=60)
    assert jobs[after["job_id"]]["state"] == "SUCCEEDED"
    assert jobs[after["job_id"]]["started_at"] >= jobs[before["job_id"]]["ended_at"]
    assert corral("logs", after["job_id"]).stdout == "trained\n"


def test_a_managed_script_moves_to_the_cluster_that_frees_up(corral, corral_env, testbed, clean_queues, tmp_path):
    """Both clusters' H100s are taken; the script waits where Slurm predicts the sooner start (alpine);
    once borealis frees up, the controller submits it there held, releases it, and cancels alpine's copy.
    The script that runs on borealis is alpine's rewritten again: its own partition and GRES spelling."""
    from tests.cli.test_jobs import FAST
    from tests.helpers import fill_h100s, job_state

    env = {**corral_env, **FAST}
    config = testbed.cluster_config
    blocker_b = fill_h100s(config)["borealis"]
    script = tmp_path / "moving.sh"
    script.write_text("#!/bin/bash\n#SBATCH --job-name=moving -p gpu\n#SBATCH --gres=gpu:h100:4 -t 5\n"
                      "echo ran on $CORRAL_CLUSTER in $SLURM_JOB_PARTITION\n")
    managed = corral("sbatch", "--managed", str(script), env=env)
    assert managed.exit_code == 0, managed.stderr
    job_id = managed.stdout.split()[-1]

    def managed_job() -> dict:
        return {j["job_id"]: j for j in corral("jobs", "queue", "-a", "--json", env=env).json()}[job_id]

    pending = wait_for("the script to wait on alpine", lambda: (j := managed_job())["slurm_job_id"]
                       and j["state"] == "PENDING" and j, 60)
    assert pending["cluster"] == "alpine"
    ssh_login(config, "borealis", f"scancel {blocker_b}")
    done = wait_for("the script to run on borealis", lambda: (j := managed_job())["state"] == "SUCCEEDED" and j, 90)
    assert done["cluster"] == "borealis" and done["moves"] == 1
    assert job_state(config, "alpine", pending["slurm_job_id"]) == "CANCELLED"
    assert corral("jobs", "logs", "--no-follow", job_id, env=env).stdout == "ran on borealis in h100-cluster\n"
    corral("server", "stop", env=env)
