"""`corral launch`, `queue`, `logs`, `cancel` against the real testbed over real SSH."""

from __future__ import annotations

import contextlib
import glob
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.helpers import counting_ssh, job_state, ssh_login


def launch(corral, *args: str, env=None) -> dict:
    result = corral("launch", "-d", "--json", *args, env=env)
    assert result.exit_code == 0, result.stderr
    return result.json()


def queue(corral, env=None) -> dict[str, dict]:
    result = corral("queue", "--json", "--all", env=env)
    assert result.exit_code == 0, result.stderr
    return {job["job_id"]: job for job in result.json()}


def wait_state(corral, job_id: str, states: set[str], timeout: float = 60) -> dict:
    return wait_for(f"{job_id} to reach {states}",
                    lambda: (job := queue(corral).get(job_id)) and job["state"] in states and job, timeout)


@pytest.fixture
def alpine_h100_full(testbed, clean_queues):
    """Every H100 of alpine taken by a job submitted outside Corral."""
    job = ssh_login(testbed.cluster_config, "alpine",
                    "sbatch -o /dev/null --parsable -p gpu -N2 --gres=gpu:nvidia_h100_80gb_hbm3:4 --wrap 'sleep 600'").strip()
    wait_for("alpine's H100s to be taken", lambda: job_state(testbed.cluster_config, "alpine", job) == "RUNNING")
    yield job


def test_gpus_only_one_cluster_has(corral, clean_queues):
    submitted = launch(corral, "--gpus", "B300:1", "--", "true")
    assert (submitted["cluster"], submitted["partition"]) == ("cirrus", "b300")
    assert submitted["job_id"].startswith("c-") and submitted["slurm_job_id"].isdigit()
    job = wait_state(corral, submitted["job_id"], {"SUCCEEDED", "FAILED"})
    assert job["state"] == "SUCCEEDED" and job["exit_code"] == 0


def test_more_gpus_than_free_on_the_first_cluster(corral, alpine_h100_full):
    plan = corral("launch", "--dryrun", "--json", "--gpus", "H100:4", "--", "true").json()
    by_place = {(c["cluster"], c["partition"]): c for c in plan}
    assert by_place[("alpine", "gpu")]["free_gpus"] == 0 and not by_place[("alpine", "gpu")]["can_start_now"]
    assert by_place[("borealis", "h100-cluster")]["chosen"] is True
    submitted = launch(corral, "--gpus", "H100:4", "--", "true")
    assert submitted["cluster"] == "borealis"


def test_nothing_free_anywhere_goes_to_the_earliest_predicted_start(corral, testbed, alpine_h100_full):
    # borealis: fill its H100s with a job that ends sooner than alpine's.
    job = ssh_login(testbed.cluster_config, "borealis",
                    "sbatch -o /dev/null --parsable -p h100-cluster -N2 --gres=gpu:H100:8 -t 30 --wrap 'sleep 600'").strip()
    wait_for("borealis' H100s to be taken", lambda: job_state(testbed.cluster_config, "borealis", job) == "RUNNING")
    plan = corral("launch", "--dryrun", "--json", "--gpus", "H100:4", "--", "true").json()
    feasible = [c for c in plan if c["feasible"]]
    assert all(not c["can_start_now"] and c["predicted_start"] for c in feasible)
    chosen = next(c for c in plan if c["chosen"])
    assert chosen["cluster"] == "borealis"  # its job ends in 30 min; alpine's has the 1 h default
    assert chosen["predicted_start"] == min(c["predicted_start"] for c in feasible)


def test_pinned_with_infra(corral, clean_queues):
    submitted = launch(corral, "--infra", "slurm/cirrus/debug", "--", "true")
    assert (submitted["cluster"], submitted["partition"]) == ("cirrus", "debug")
    bad = corral("launch", "-d", "--infra", "slurm/cirrus/nope", "--", "true")
    assert bad.exit_code == 66 and "cirrus: no partition 'nope'; partitions: b300, debug, maint" in bad.stderr


def test_stopped_controller_fails_over_and_says_why(corral, testbed, clean_queues):
    testbed.stop_controller("alpine")
    try:
        result = corral("launch", "-d", "--gpus", "H100:1", "--", "true")
    finally:
        testbed.start_controller("alpine")
    assert result.exit_code == 0, result.stderr
    assert "alpine: Slurm controller is down" in result.stderr
    assert "submitted to slurm/borealis/h100-cluster" in result.stderr


def test_rejected_submission_fails_over_at_once(corral, corral_env, clean_queues, tmp_path):
    # Only borealis' nodes have the feature "ib". Placement reads slurm.constraint (and would leave alpine
    # out), not a raw sbatch argument: alpine ranks first, and its sbatch says no.
    task = tmp_path / "ib.yaml"
    task.write_text("resources:\n  accelerators: gpu:1\nslurm:\n  sbatch_args: [--constraint=ib]\nrun: echo on-ib\n")
    result = corral("launch", "-d", "--json", str(task))
    assert result.exit_code == 0, result.stderr
    submitted = result.json()
    assert submitted["cluster"] == "borealis"
    skipped = {s["infra"]: s["reason"] for s in submitted["skipped"]}
    assert "Invalid feature specification" in skipped["slurm/alpine/gpu"]
    # sbatch said no, so alpine holds no copy: refreshes do not watch it for orphans.
    env, calls = counting_ssh(tmp_path, corral_env)
    assert submitted["job_id"] in queue(corral, env=env)
    assert calls() == ["borealis"]


def test_a_full_job_table_is_a_clear_rejection_not_a_hang(corral, testbed, clean_queues):
    # Slurm refuses jobs beyond MaxJobCount (finished ones count while MinJobAge keeps them); sbatch
    # would then sleep and retry for minutes.
    config = testbed.cluster_config
    records = int(ssh_login(config, "cirrus", "squeue -h -t all | wc -l").strip())
    testbed.limit_jobs("cirrus", records + 1)
    try:
        wait_for("cirrus's job table to be full", lambda: subprocess.run(
            ["ssh", "-F", str(config), "cirrus", "timeout 3 sbatch -H -p debug --wrap true"],
            capture_output=True).returncode == 124, timeout=60, interval=0)
        before = ssh_login(config, "cirrus", "squeue -h -t all -o %i | sort").split()
        result = corral("launch", "-d", "--infra", "slurm/cirrus", "--cpus", "1", "--", "true")
        assert result.exit_code == 69
        assert "Slurm is not accepting jobs now" in result.stderr and "MaxJobCount" in result.stderr
        assert ssh_login(config, "cirrus", "squeue -h -t all -o %i | sort").split() == before  # nothing got in
    finally:
        testbed.limit_jobs("cirrus", None)


def test_two_node_task_sees_its_environment_on_both_nodes(corral, clean_queues):
    script = ('echo "rank=$CORRAL_NODE_RANK host=$(hostname) n=$CORRAL_NUM_NODES gpus=$CORRAL_NUM_GPUS_PER_NODE '
              'ips=$(echo $CORRAL_NODE_IPS | tr " " ,) id=$CORRAL_TASK_ID sky=$SKYPILOT_NODE_RANK '
              'cluster=$CORRAL_CLUSTER"')
    result = corral("launch", "--gpus", "B300:2", "--num-nodes", "2", "--", script)
    assert result.exit_code == 0, result.stderr
    # Each line after its node's rank, as srun --label writes it.
    lines = sorted(line for line in result.stdout.splitlines() if line[3:].startswith("rank="))
    job_id = next(word.split("=")[1] for word in lines[0].split() if word.startswith("id="))
    assert lines == [
        f"0: rank=0 host=c1 n=2 gpus=2 ips=127.0.0.1,127.0.0.1 id={job_id} sky=0 cluster=cirrus",
        f"1: rank=1 host=c2 n=2 gpus=2 ips=127.0.0.1,127.0.0.1 id={job_id} sky=1 cluster=cirrus",
    ]
    assert f"{job_id} SUCCEEDED on slurm/cirrus/b300" in result.stderr


def test_logs_of_a_pending_job_say_why_it_waits_then_follow_it(corral, clean_queues):
    first = launch(corral, "--infra", "slurm/cirrus/debug", "--gpus", "gpu:2", "--", "sleep 12")["job_id"]
    second = launch(corral, "--infra", "slurm/cirrus/debug", "--gpus", "gpu:2", "--", "echo second")["job_id"]
    wait_state(corral, second, {"PENDING"})
    waiting = corral("logs", "--status", second)  # not ended: 75, "ask again later", and no output
    assert (waiting.exit_code, waiting.stdout) == (75, f"{second} PENDING on slurm/cirrus/debug\n"), waiting.stderr
    snapshot = corral("logs", "--no-follow", second)  # it printed nothing and said nothing, before
    assert (snapshot.exit_code, snapshot.stdout) == (0, "") and snapshot.stderr.startswith(
        f"corral: {second} is PENDING on slurm/cirrus/debug") and snapshot.stderr.endswith(
        f": no output yet; `corral logs {second}` waits for it\n"), snapshot.stderr
    followed = corral("logs", second)  # waits behind the first, as `sky logs` of a job not yet started
    assert (followed.exit_code, followed.stdout) == (0, "second\n"), followed.stderr
    # (with Slurm's reason once its scheduler has given one: "None" right after submission is not shown)
    assert f"corral: {second} PENDING on slurm/cirrus/debug" in followed.stderr, followed.stderr
    assert f"corral: {second} SUCCEEDED" in followed.stderr
    assert queue(corral)[first]["state"] == "SUCCEEDED"


def test_following_a_job_whose_login_node_stops_answering_ends_with_69_not_a_wait(corral, corral_env, testbed,
                                                                                   clean_queues):
    job_id = launch(corral, "--infra", "slurm/cirrus/debug", "--",
                    "for i in $(seq 600); do echo line-$i; sleep 1; done")["job_id"]
    follower = subprocess.Popen([sys.executable, "-m", "corral", "logs", job_id], env=corral_env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert follower.stdout is not None and follower.stdout.readline() == "line-1\n"
        testbed.freeze_login("cirrus")
        frozen = time.monotonic()
        out, err = follower.communicate(timeout=120)
        waited = time.monotonic() - frozen
        # --no-follow: what there is, then the error on stderr and 69 (it was 0, the error in the output)
        snapshot = corral("logs", "--no-follow", job_id, timeout=120)
    finally:
        follower.kill()
        testbed.thaw_login("cirrus")
    assert follower.returncode == 69, err
    assert all(line.startswith("line-") for line in out.splitlines()), out  # the job's output only
    assert "corral: error: cirrus: " in err  # and the server's word on stderr
    assert f"corral: stopped following {job_id}, still " in err and f"`corral logs {job_id}` follows it again" in err
    assert waited < 60, waited  # not the wait for a job's end to settle
    assert snapshot.exit_code == 69 and "error" not in snapshot.stdout, snapshot
    assert snapshot.stderr.startswith("corral: error: cirrus: "), snapshot.stderr
    wait_for("cirrus to answer again", lambda: corral("check", "cirrus").exit_code == 0, timeout=30)
    assert corral("cancel", job_id).exit_code == 0


def test_exit_code_and_setup_failure(corral, corral_env, clean_queues, tmp_path):
    assert corral("launch", "--infra", "slurm/alpine/cpu", "--", "echo out; exit 7").exit_code == 7
    # `corral logs` follows to the end and exits as the job did, so a script can wait on it; --no-follow only prints.
    followed = corral("logs")
    assert (followed.exit_code, followed.stdout) == (7, "out\n"), followed.stderr
    assert re.search(r"corral: c-\w+ FAILED on slurm/alpine/cpu \(exit code 7\)", followed.stderr), followed.stderr
    assert corral("logs", "--no-follow").exit_code == 0
    status = corral("logs", "--status")  # how it ended, without its output: a script's check
    assert status.exit_code == 7 and re.fullmatch(r"c-\w+ FAILED on slurm/alpine/cpu \(exit code 7\)\n", status.stdout)
    # --sync-down (`sky logs --sync-down`): its output saved under ~/corral_logs/<job id>/, the path printed.
    home = tmp_path / "laptop"
    saved = corral("logs", "--sync-down", env={**corral_env, "HOME": str(home)})
    job_id = status.stdout.split()[0]
    assert (saved.exit_code, saved.stdout) == (0, f"{home}/corral_logs/{job_id}/run.log\n"), saved.stderr
    assert (home / "corral_logs" / job_id / "run.log").read_text() == "out\n"
    assert f"{job_id}: 4 bytes saved to" in saved.stderr
    task = tmp_path / "t.yaml"
    task.write_text("setup: exit 5\nrun: echo never\nresources:\n  infra: slurm/alpine/cpu\n")
    result = corral("launch", str(task))
    assert result.exit_code == 5
    assert "corral: setup failed on a3 with exit code 5" in result.stdout and "never" not in result.stdout


def test_logs_follow_a_running_job_and_cancel_stops_it(corral, corral_env, clean_queues):
    submitted = launch(corral, "--infra", "slurm/cirrus/debug", "--",
                       "for i in 1 2 3; do echo line-$i; sleep 1; done; sleep 600")
    job_id = submitted["job_id"]
    follower = subprocess.Popen([sys.executable, "-m", "corral", "logs", "-f", job_id], env=corral_env,
                                stdout=subprocess.PIPE, text=True)
    tailing = None
    try:
        assert follower.stdout is not None
        seen = [follower.stdout.readline().strip() for _ in range(3)]
        assert seen == ["line-1", "line-2", "line-3"]
        assert queue(corral)[job_id]["state"] == "RUNNING"  # followed while running
        tailing = subprocess.Popen([sys.executable, "-m", "corral", "logs", "--tail", "1", job_id], env=corral_env,
                                   stdout=subprocess.PIPE, text=True)  # `sky logs --tail 1`: the last line, then on
        assert tailing.stdout is not None and tailing.stdout.readline().strip() == "line-3"
        cancelled = corral("cancel", "-a", "-y")  # `sky cancel -a -y`: every live job, and only those
        assert cancelled.exit_code == 0 and cancelled.stdout.strip() == f"{job_id}: cancelled", cancelled.stdout
        # The follower ends when the job does, with its status, as `sky logs`: 1, cancelled (no exit code).
        assert follower.wait(timeout=30) == 1
        assert tailing.wait(timeout=30) == 1  # and so does the tailing one
    finally:
        follower.kill()
        if tailing is not None:
            tailing.kill()
    job = wait_state(corral, job_id, {"CANCELLED"})
    assert job["state"] == "CANCELLED"
    assert corral("cancel", job_id).stdout.strip() == f"{job_id}: already cancelled"
    none = corral("cancel", "--all")
    assert (none.exit_code, none.stdout) == (0, "") and "no live jobs to cancel" in none.stderr
    whole = corral("logs", "--no-follow", job_id).stdout.splitlines()
    assert whole[:3] == ["line-1", "line-2", "line-3"] and any("CANCELLED" in line for line in whole[3:])
    newest = corral("logs", "--no-follow", "--tail", "2")  # no JOB: the newest job, as `sky logs` takes the latest
    # What follows line-3 is Slurm's word on the cancellation, and bash's "Terminated" when the sleep dies first.
    assert newest.exit_code == 0 and newest.stdout.splitlines() == whole[-2:]


def test_logs_read_by_a_client_that_stops_reading_hold_up_the_login_nodes_reader_not_the_servers_memory(
        corral, corral_env, clean_queues):
    """`corral logs JOB | less`, paused on its first screen: once the server holds a few MB for that
    client, it stops reading the remote log (the login node's `tail` waits, short of the end) instead of
    taking all 200 MB into its memory; read on, every byte arrives."""
    size = 200_000_000
    submitted = launch(corral, "--infra", "slurm/alpine/cpu", "--", f"head -c {size} /dev/zero | tr '\\0' x; echo")
    job_id = submitted["job_id"]
    wait_state(corral, job_id, {"SUCCEEDED"}, timeout=120)
    server = corral("server", "status", "--json").json()["pid"]

    def rss_mb(pid: int) -> float:
        status = Path(f"/proc/{pid}/status").read_text()
        return int(status.split("VmRSS:")[1].split()[0]) / 1024

    before = rss_mb(server)
    reader = subprocess.Popen([sys.executable, "-m", "corral", "logs", "--no-follow", job_id], env=corral_env,
                              stdout=subprocess.PIPE)
    try:
        assert reader.stdout is not None and reader.stdout.read(1 << 20) == b"x" * (1 << 20)

        def position() -> int | None:
            """Where the login node's `tail` of that log is in it (the testbed shares this PID space)."""
            found = subprocess.run(["pgrep", "-u", "corral-test", "-x", "tail"], capture_output=True, text=True)
            for pid in found.stdout.split():
                for fd in glob.glob(f"/proc/{pid}/fd/*"):
                    with contextlib.suppress(OSError):
                        if os.stat(fd).st_size > size:  # the log: the bytes and a newline
                            return int(Path(fd.replace("/fd/", "/fdinfo/")).read_text().split()[1])
            return None

        samples: list[int | None] = []

        def waiting() -> bool:  # its position stays put across two looks, short of the end
            samples.append(position())
            return len(samples) > 1 and samples[-1] is not None and samples[-1] == samples[-2] < size

        wait_for("the login node's tail to wait for the paused client", waiting, timeout=30, interval=0.5)
        assert rss_mb(server) - before < 64, (before, rss_mb(server))
        rest = reader.stdout.read()
        assert len(rest) + (1 << 20) == size + 1 and rest.rstrip(b"\n") == b"x" * (size - (1 << 20))
    finally:
        reader.kill()


def test_queue_matches_slurm_on_every_cluster_with_one_query_each(corral, corral_env, testbed, clean_queues, tmp_path):
    jobs = {
        "alpine": launch(corral, "--infra", "slurm/alpine/cpu", "--", "sleep 600"),
        "borealis": launch(corral, "--infra", "slurm/borealis", "--gpus", "H100:8", "--num-nodes", "2", "--",
                           "sleep 600"),
        "cirrus": launch(corral, "--infra", "slurm/cirrus/debug", "--", "exit 3"),
    }
    extra = launch(corral, "--infra", "slurm/borealis", "--gpus", "H100:8", "--num-nodes", "2", "--", "true")
    wait_state(corral, jobs["cirrus"]["job_id"], {"FAILED"})
    wait_state(corral, jobs["alpine"]["job_id"], {"RUNNING"})
    # One ssh call per cluster with live jobs.
    env, calls = counting_ssh(tmp_path, corral_env)
    listed = queue(corral, env=env)
    assert sorted(calls()) == ["alpine", "borealis"]  # cirrus' only job has ended: nothing to ask there
    slurm_state = {"RUNNING": "RUNNING", "PENDING": "PENDING", "FAILED": "FAILED"}
    for cluster, submitted in [*jobs.items(), ("borealis", extra)]:
        row = listed[submitted["job_id"]]
        assert row["cluster"] == cluster and row["slurm_job_id"] == submitted["slurm_job_id"]
        truth = job_state(testbed.cluster_config, cluster, submitted["slurm_job_id"])
        assert slurm_state[row["state"]] == truth, (row, truth)
    assert listed[extra["job_id"]]["state"] == "PENDING"
    wait_for("the Slurm pending reason", lambda: queue(corral)[extra["job_id"]]["reason"] == "Resources")
    assert listed[jobs["cirrus"]["job_id"]]["exit_code"] == 3


def test_crash_between_sbatch_and_the_database_write(corral, corral_env, testbed, clean_queues):
    """The engine (the server) dies between sbatch and recording the job's id: the client says so, and
    the next server finds the job by its token and adopts it."""
    crashed = corral("launch", "-d", "--infra", "slurm/cirrus/debug", "--", "sleep 600",
                     env={**corral_env, "CORRAL_TEST_CRASH_AFTER_SBATCH": "1"})
    assert crashed.exit_code == 69 and "the server stopped answering /v1/launch midway" in crashed.stderr
    listed = list(queue(corral).values())
    assert len(listed) == 1
    job = listed[0]
    assert job["slurm_job_id"] and job["state"] in ("PENDING", "RUNNING")
    in_slurm = ssh_login(testbed.cluster_config, "cirrus", "squeue -h -u corral-test -o '%i %j'").split("\n")
    corral_jobs = [line for line in in_slurm if "corral-" in line]
    assert len(corral_jobs) == 1 and corral_jobs[0].split()[0] == job["slurm_job_id"]


def test_a_lost_submit_answer_never_runs_the_job_twice(corral, corral_env, testbed, clean_queues):
    # alpine accepts the job but its answer is lost (a dropped connection): Corral fails over to
    # another cluster. The copy alpine holds is an orphan; the next refresh finds it and cancels it.
    config = testbed.cluster_config
    in_alpine = "squeue -h --me -t all -o '%i %j'"  # -t all: cancelled ones too, for MinJobAge
    before = set(ssh_login(config, "alpine", in_alpine).splitlines())
    lost = corral("launch", "-d", "--json", "--cpus", "1", "--", "sleep 600",
                  env={**corral_env, "CORRAL_TEST_LOSE_SUBMIT_ANSWER": "alpine"})
    assert lost.exit_code == 0, lost.stderr
    submitted = lost.json()
    assert submitted["cluster"] != "alpine"
    assert any(s["infra"].startswith("slurm/alpine/") and "the answer was lost" in s["reason"]
               for s in submitted["skipped"])
    # Slurm did take it (the server's first tick, right after the launch, may have cancelled it already)
    new = [line for line in ssh_login(config, "alpine", in_alpine).splitlines() if line not in before]
    assert len(new) == 1 and new[0].split()[1].startswith("corral-"), new
    orphan = new[0].split()
    listed = queue(corral)  # a refresh: alpine is watched because a submission there failed
    assert [j["cluster"] for j in listed.values()] == [submitted["cluster"]]
    # Cancelled, or, when its scancel met it starting, ended by the cancel marker before its task ran.
    state = job_state(config, "alpine", orphan[0])
    if state == "FAILED":
        run_dir = ssh_login(config, "alpine", f"squeue -h -t all -j {orphan[0]} -o %Z").strip()
        assert "corral: cancelled before it started" in ssh_login(config, "alpine", f"cat {run_dir}/log.txt")
    else:
        assert state == "CANCELLED"


def test_a_job_cancelled_as_it_starts_never_runs_its_task(corral, testbed, clean_queues, tmp_path):
    # Corral leaves a marker in the run dir before it scancels a job. A kill that reaches the node
    # while the job is being launched can find nothing to kill (the churn test caught a moved job
    # whose cancelled attempt ran to the end); the job's script sees the marker and stops.
    config = testbed.cluster_config
    task = tmp_path / "held.yaml"
    task.write_text("resources:\n  cpus: 1\nslurm:\n  sbatch_args: [--hold]\nrun: echo the task ran\n")
    held = corral("launch", "-d", "--json", "--infra", "slurm/alpine/cpu", str(task))
    assert held.exit_code == 0, held.stderr
    job = held.json()["slurm_job_id"]
    run_dir = ssh_login(config, "alpine", f"squeue -h -j {job} -o %Z").strip()
    ssh_login(config, "alpine", f": > {run_dir}/cancelled && scontrol release {job}")  # the lost-kill case
    # FAILED, not COMPLETED: a task that never ran must not count as a success (the churn test caught
    # a moved job called SUCCEEDED that way, its held replacement then cancelled)
    wait_for("the job to end", lambda: job_state(config, "alpine", job) == "FAILED")
    log = ssh_login(config, "alpine", f"cat {run_dir}/log.txt")
    assert "corral: cancelled before it started" in log and "the task ran" not in log


def test_a_running_task_that_slurms_kill_missed_ends_at_the_cancel_marker(corral, testbed, clean_queues):
    # A kill that reaches a step while Slurm is still launching it can miss the task: Slurm reports the
    # job cancelled, and the task runs on (the churn test caught one finishing its work after its
    # replacement had started). The marker Corral leaves before each scancel ends it all the same.
    config = testbed.cluster_config
    submitted = launch(corral, "--infra", "slurm/alpine/cpu", "--",
                       "echo started; sleep 1001 & sleep 60; echo the task ran on")
    job = submitted["slurm_job_id"]
    wait_state(corral, submitted["job_id"], {"RUNNING"})
    run_dir = ssh_login(config, "alpine", f"squeue -h -j {job} -o %Z").strip()
    wait_for("the task to start", lambda: "started" in ssh_login(config, "alpine", f"cat {run_dir}/log.txt"))
    ssh_login(config, "alpine", f": > {run_dir}/cancelled")  # the marker alone: no scancel
    wait_for("the job to end", lambda: job_state(config, "alpine", job) not in ("RUNNING", "COMPLETING"),
             timeout=15)
    assert "the task ran on" not in ssh_login(config, "alpine", f"cat {run_dir}/log.txt")
    # its background process went with it: the whole process group, as Slurm itself would kill it
    assert ssh_login(config, "alpine", "pgrep -f '^sleep 1001$' || true").strip() == ""


def test_values_arrive_byte_for_byte_through_slurm(corral, testbed, clean_queues):
    awkward = "it's a \"test\" $(whoami) `id` \\ $HOME\nsecond line\ttab ünïcode"
    result = corral("launch", "--infra", "slurm/alpine/cpu", "--env", f"AWKWARD={awkward}", "-n", "name $(x) 'q'",
                    "--", 'printf "%s" "$AWKWARD" > "$CORRAL_TASK_ID.out"')
    assert result.exit_code == 0, result.stderr
    job = next(iter(queue(corral).values()))
    assert job["name"] == "name $(x) 'q'"
    out = ssh_login(testbed.cluster_config, "alpine", f"cat .corral/runs/*/workdir/{job['job_id']}.out")
    assert out == awkward


def test_workdir_and_file_mounts_are_synced(corral, clean_queues, tmp_path):
    """Relative local paths are relative to where the command runs (as in SkyPilot), not to the file."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('hello from workdir')\n")
    (tmp_path / "data.txt").write_text("mounted data\n")
    (tmp_path / "tasks").mkdir()
    task = tmp_path / "tasks" / "task.yaml"
    task.write_text(
        "workdir: src\nfile_mounts:\n  inputs/data.txt: data.txt\n"
        "resources:\n  infra: slurm/borealis/l40s\nrun: cat train.py inputs/data.txt\n"
    )
    result = corral("launch", "tasks/task.yaml", cwd=tmp_path)
    assert result.exit_code == 0, result.stderr
    assert "print('hello from workdir')\nmounted data\n" in result.stdout


def test_bad_task_input_is_clear_and_submits_nothing(corral, tmp_path):
    task = tmp_path / "t.yaml"
    task.write_text("resources:\n  acelerators: H100:1\nrun: echo\n")
    result = corral("launch", "-d", str(task))
    assert result.exit_code == 65
    assert result.stderr.strip() == (
        f"corral: error: {task}: invalid task: resources.acelerators: unknown field; did you mean 'accelerators'?")
    (tmp_path / "img.yaml").write_text("resources:\n  accelerators: H100:1\n  image_id: docker:pytorch\nrun: echo\n")
    no_runtime = corral("launch", "-d", str(tmp_path / "img.yaml"))
    assert no_runtime.exit_code == 69
    assert "image_id needs a container runtime" in no_runtime.stderr
    impossible = corral("launch", "-d", "--gpus", "H100:16", "--", "true")
    assert impossible.exit_code == 69
    assert ("\n  slurm/borealis/h100-cluster: needs 1 node(s) with H100:16; partition has 0 (at most H100:8 a node)\n"
            in impossible.stderr)  # each place's reason on a line of its own
    assert queue(corral) == {}  # nothing was recorded, nothing submitted


def test_schema(corral):
    result = corral("schema")
    assert result.exit_code == 0 and "accelerators" in result.json()["$defs"]["Resources"]["properties"]


def test_dryrun_plan_json(corral):
    plan = corral("launch", "--dryrun", "--json", "--gpus", "L4:1", "--", "true").json()
    assert {"cluster", "partition", "feasible", "reason", "free_gpus", "predicted_start", "chosen"} <= set(plan[0])
    chosen = [c for c in plan if c["chosen"]]
    assert [(c["cluster"], c["partition"]) for c in chosen] == [("alpine", "inference")]
    assert time.time() - 120 < chosen[0]["predicted_start"] <= time.time() + 5


def test_skypilots_launch_flags_mean_here_what_its_task_fields_mean(corral):
    """Typed from habit: --cloud/--region/--zone place the job as the task file's fields do; the cloud VM
    flags are ignored with the task file's words; none is "No such option"."""
    planned = corral("launch", "--dryrun", "--json", "--cloud", "slurm", "--region", "cirrus", "--zone", "debug",
                     "--use-spot", "--disk-size", "100", "--ports", "8080", "--retry-until-up", "--down", "--fast",
                     "--", "true")
    assert planned.exit_code == 0, planned.stderr
    assert "--fast: nothing to skip" in planned.stderr
    assert [(r["cluster"], r["partition"]) for r in planned.json()] == [("cirrus", "debug")]
    assert "--use-spot: ignored on Slurm (Slurm has no spot VMs" in planned.stderr
    assert "--disk-size: ignored on Slurm" in planned.stderr and "--ports: ignored on Slurm" in planned.stderr
    assert "--retry-until-up: nothing to retry" in planned.stderr
    for argv, message in ((["--cloud", "slurm", "--infra", "slurm/alpine"], "either --infra or --cloud"),
                          (["--zone", "debug"], "need --cloud"),
                          (["--retry-until-up", "--no-setup"], "--no-setup goes with -c NAME"),  # test_fuzz
                          (["--fast", "--zone", "debug"], "need --cloud")):  # found by test_fuzz: no note first
        refused = corral("launch", "--dryrun", *argv, "--", "true")
        assert refused.exit_code == 2 and message in refused.stderr, refused.stderr
        assert refused.stderr.count("\n") == 1, refused.stderr  # an error is one line
    # and the other commands' flags that have nothing to change here (`sky status -r`, `sky show-gpus -a`)
    for argv in (["status", "--refresh"], ["jobs", "queue", "-r"], ["gpus", "-a", "--infra", "slurm/cirrus"]):
        accepted = corral(*argv)
        assert accepted.exit_code == 0 and accepted.stderr == "", (argv, accepted.stderr)
    recorded = corral("jobs", "launch", "--async", "--infra", "slurm/cirrus", "--", "true")
    assert re.fullmatch(r"c-[0-9a-f]+\n", recorded.stdout), recorded.stderr  # `sky jobs launch --async`: as -d


def test_sweep_is_spread_over_clusters_as_job_arrays(corral, clean_queues):
    result = corral("launch", "-d", "--json", "--num-jobs", "12", "--gpus", "gpu:2", "--",
                    'echo "rank=$CORRAL_JOB_RANK of=$CORRAL_NUM_JOBS id=$CORRAL_TASK_ID"')
    assert result.exit_code == 0, result.stderr
    jobs = result.json()
    assert len(jobs) == 12 and len({j["job_id"] for j in jobs}) == 12
    places = {(j["cluster"], j["partition"]) for j in jobs}
    assert len({c for c, _ in places}) >= 2  # more than one cluster's free GPUs were used
    # One sbatch per (cluster, partition): array tasks share their array's base id.
    bases = {(j["cluster"], j["slurm_job_id"].split("_")[0]) for j in jobs}
    assert len(bases) == len(places)
    for job in jobs:
        wait_state(corral, job["job_id"], {"SUCCEEDED"})
    seen = {}
    for rank, job in enumerate(jobs):
        out = corral("logs", "--no-follow", job["job_id"]).stdout.strip()
        assert out == f"rank={rank} of=12 id={job['job_id']}"
        seen[rank] = job["job_id"]
    assert sorted(seen) == list(range(12))


def test_several_task_files_in_one_launch(corral, clean_queues, tmp_path):
    (tmp_path / "a.yaml").write_text("name: a\nresources:\n  infra: slurm/alpine/cpu\nrun: echo a\n")
    (tmp_path / "b.yaml").write_text("name: b\nresources:\n  accelerators: L40S:1\nrun: echo b\n")
    result = corral("launch", "-d", "--json", str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml"))
    assert result.exit_code == 0, result.stderr
    jobs = result.json()
    assert [(j["cluster"], j["partition"]) for j in jobs] == [("alpine", "cpu"), ("borealis", "l40s")]
    names = {queue(corral)[j["job_id"]]["name"] for j in jobs}
    assert names == {"a", "b"}


def test_state_in_postgresql(corral, corral_env, postgres_url, clean_queues):
    env = {**corral_env, "CORRAL_DB_URL": postgres_url}
    submitted = launch(corral, "-n", "on-postgres", "--infra", "slurm/cirrus/debug", "--", "true", env=env)
    job = wait_for("the job to finish", lambda: (
        row := queue(corral, env=env).get(submitted["job_id"])) and row["state"] == "SUCCEEDED" and row)
    assert job["name"] == "on-postgres"
    assert submitted["job_id"] not in queue(corral)  # not in the default SQLite store


@pytest.mark.parametrize("cluster", ["alpine", "borealis"])  # without and with accounting
def test_status_of_jobs_slurm_has_forgotten(corral_env, cluster):
    """Tracked ids that squeue no longer shows are looked up in sacct where there is one; no error."""
    import asyncio

    from corral.client import Client

    statuses = asyncio.run(Client().infra(cluster).status(["999999", "999998_3"]))
    assert all(s.handle not in ("999999", "999998_3") for s in statuses)


def test_a_relaunch_from_one_folder_syncs_only_changes_into_the_cluster_side_cache(corral, testbed, clean_queues,
                                                                                   tmp_path):
    """The workdir goes to ~/.corral/cache/<key> (one per machine and folder) by rsync, then into the
    attempt's own folder as hard links: the unchanged file is one inode shared by the cache and both
    attempts, and each attempt still runs the workdir as it was when it was launched."""
    import hashlib
    import socket

    work = tmp_path / "work"
    work.mkdir()
    (work / "keep.txt").write_text("unchanged\n")
    (work / "change.txt").write_text("v1\n")
    (tmp_path / "task.yaml").write_text("workdir: work\nresources:\n  infra: slurm/alpine/cpu\nrun: cat change.txt\n")
    first = corral("launch", "-d", "--json", "task.yaml", cwd=tmp_path)
    assert first.exit_code == 0, first.stderr
    (work / "change.txt").write_text("v2\n")
    second = corral("launch", "-d", "--json", "task.yaml", cwd=tmp_path)
    assert second.exit_code == 0, second.stderr
    # an edit of the same size within the same second as the last: rsync's quick check in whole seconds
    # would take it for unchanged
    before = (work / "change.txt").stat().st_mtime_ns
    (work / "change.txt").write_text("v3\n")
    second_start = before // 10**9 * 10**9
    os.utime(work / "change.txt", ns=(before, second_start + (before - second_start + 500_000_000) % 10**9))
    third = corral("launch", "-d", "--json", "task.yaml", cwd=tmp_path)
    assert third.exit_code == 0, third.stderr
    jobs = [first.json()["job_id"], second.json()["job_id"], third.json()["job_id"]]
    for job in jobs:
        wait_state(corral, job, {"SUCCEEDED"})
    assert [corral("logs", "--no-follow", job).stdout for job in jobs] == ["v1\n", "v2\n", "v3\n"]
    key = hashlib.sha256(f"{socket.gethostname()}:{work}".encode()).hexdigest()[:16]
    cache = f".corral/cache/{key}"
    links = ssh_login(testbed.cluster_config, "alpine",
                      f"cat {cache}/change.txt; stat -c %h {cache}/keep.txt {cache}/change.txt")
    assert links.split() == ["v3", "4", "2"]  # keep.txt: cache + 3 attempts; change.txt: cache + the 3rd


def test_ctrl_c_on_an_attached_launch_leaves_the_job_running_and_says_how_to_stop_it(corral, corral_env,
                                                                                      clean_queues):
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "corral", "launch", "--infra", "slurm/alpine/cpu", "--",
                             "echo started; sleep 300"], env=corral_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        [job_id] = wait_for("the job to run", lambda: [j for j, row in queue(corral).items()
                                                         if row["state"] == "RUNNING"], 60)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert f"{job_id} keeps running on slurm/alpine/cpu" in err
    assert f"`corral cancel {job_id}` stops it" in err and "Traceback" not in err
    assert queue(corral)[job_id]["state"] == "RUNNING"
    assert corral("cancel", job_id).exit_code == 0


def test_a_detached_launch_costs_one_probe_per_candidate_cluster_and_one_submission(corral, corral_env,
                                                                                     clean_queues, tmp_path):
    """SSH round trips, counted in the server (the one process that talks to clusters): nothing cached,
    nothing repeated."""
    env, calls = counting_ssh(tmp_path, corral_env)
    assert corral("queue", env=env).exit_code == 0  # the server, started with the counting ssh
    before = len(calls())
    pinned = corral("launch", "-d", "--infra", "slurm/cirrus/debug", "--", "true", env=env)
    assert pinned.exit_code == 0, pinned.stderr
    assert calls()[before:] == ["cirrus", "cirrus"]  # probe, then sbatch
    before = len(calls())
    anywhere = corral("launch", "-d", "--json", "--cpus", "1", "--", "true", env=env)
    assert anywhere.exit_code == 0, anywhere.stderr
    chosen = anywhere.json()["cluster"]
    assert sorted(calls()[before:]) == sorted(["alpine", "borealis", "cirrus", chosen])


def test_skypilot_habits_a_command_without_dashes_env_from_the_shell_env_file_workdir_and_logs_that_follow(
        corral, corral_env, clean_queues, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "note.txt").write_text("from the workdir\n")
    env_file = tmp_path / "vars.env"
    env_file.write_text("# dotenv\nexport FROM_FILE='file value'\nSHARED=file\n\n")
    env = {**corral_env, "GREETING": "hello"}
    ran = corral("launch", "-y", "--infra", "slurm/cirrus", "--cpus", "1", "--env", "GREETING", "--env-file",
                 str(env_file), "--env", "SHARED=flag", "--workdir", str(work),
                 'echo "$GREETING|$FROM_FILE|$SHARED"; cat note.txt', env=env)
    assert ran.exit_code == 0, ran.stderr
    assert ran.stdout.splitlines()[-2:] == ["hello|file value|flag", "from the workdir"]  # --env wins over the file
    [job] = queue(corral)
    # `corral logs` follows by default, as `sky logs`: for an ended job it prints everything and returns.
    followed = corral("logs", job)
    assert followed.exit_code == 0 and followed.stdout.splitlines()[-1] == "from the workdir"

    # A SkyPilot task with cloud-only fields plans, saying once per field what is ignored.
    corpus = Path(__file__).resolve().parents[1] / "fixtures" / "skypilot"
    planned = corral("launch", "--dryrun", str(corpus / "ports_labels_images.yaml"))
    assert planned.exit_code == 0, planned.stderr
    warned = [line for line in planned.stderr.splitlines() if line.startswith("corral: warning: ")]
    assert [w.split(": ")[3] for w in warned] == ["resources.use_spot", "resources.disk_size", "resources.ports",
                                                  "resources.labels", "resources.image_id"], warned
    # A key written twice is said, not refused: YAML keeps the later one (SkyPilot's loader too), so the
    # earlier block would be lost without a word.
    twice = tmp_path / "twice.yaml"
    twice.write_text("envs: {A: '1'}\nrun: echo $A $B\nresources:\n  cpus: 1\n  cpus: 2\nenvs: {B: '2'}\n")
    planned = corral("launch", "--dryrun", str(twice))
    assert planned.exit_code == 0, planned.stderr
    warned = [line for line in planned.stderr.splitlines() if line.startswith("corral: warning: ")]
    assert [w.split(": ")[3] for w in warned] == ["resources.cpus", "envs"], warned
    missing = corral("launch", "--env", "NOT_SET_ANYWHERE", "--", "true", env=corral_env)
    assert missing.exit_code != 0 and "NOT_SET_ANYWHERE is not set in your environment" in missing.stderr

    # `corral check slurm` checks every cluster, as `sky check slurm` checks the Slurm infra.
    checked = corral("check", "slurm", "--json")
    assert checked.exit_code == 0 and {c["cluster"] for c in checked.json()} == {"alpine", "borealis", "cirrus"}
    assert [c["cluster"] for c in corral("check", "slurm/cirrus", "--json").json()] == ["cirrus"]



def test_object_storage_mounts_reach_the_cluster_through_the_server(corral, corral_env, clean_queues, tmp_path,
                                                                    s3_server):
    bucket = s3_server.bucket_with_data(tmp_path.name)
    env = {**corral_env, **s3_server.env}
    task = tmp_path / "data.yaml"
    task.write_text(f"resources: {{cpus: 1, infra: slurm/cirrus}}\nfile_mounts:\n  data: s3://{bucket}/imagenet/train\n"
                    f"  /tmp/corral-test-model-{tmp_path.name}/model.bin: {{source: s3://{bucket}/model.bin, mode: COPY}}\n"
                    "run: cat data/a.txt data/sub/b.txt; wc -c < /tmp/corral-test-model-*/model.bin\n")
    planned = corral("launch", "--dryrun", str(task), env=env)
    assert planned.exit_code == 0, planned.stderr
    assert "Files to send: cirrus 1016 B " in planned.stdout  # listed, not fetched
    ran = corral("launch", str(task), env=env)
    assert ran.exit_code == 0, ran.stderr
    assert ran.stdout.splitlines()[-3:] == ["alpha", "beta beta", "1000"]
    gone = tmp_path / "gone.yaml"
    gone.write_text(f"file_mounts:\n  data: s3://{bucket}/no/such/prefix\nrun: ls data\n")
    refused = corral("launch", str(gone), env=env)
    assert refused.exit_code == 65 and "s3://" in refused.stderr and "no objects under it" in refused.stderr



def test_a_dry_run_says_what_each_cluster_must_be_sent(corral, clean_queues, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "weights.bin").write_bytes(b"w" * 50_000)
    task = tmp_path / "t.yaml"
    task.write_text(f"workdir: {work}\nresources:\n  cpus: 1\n  any_of: [{{infra: slurm/alpine/cpu}}, "
                    "{infra: slurm/cirrus/debug}]\nrun: wc -c < weights.bin\n")

    def sends() -> dict[str, int]:
        planned = corral("launch", "--dryrun", "--json", str(task))
        assert planned.exit_code == 0, planned.stderr
        return {r["cluster"]: r["transfer_bytes"] for r in planned.json() if r.get("feasible")}

    assert sends() == {"alpine": 50_000, "cirrus": 50_000}  # neither cluster has seen this workdir
    ran = corral("launch", "--infra", "slurm/cirrus/debug", str(task))
    assert ran.exit_code == 0 and ran.stdout.splitlines()[-1] == "50000", ran.stderr
    # The cache now holds it: nothing to send. (The testbed's clusters share one machine and so one home:
    # alpine's cache is cirrus's here; on real clusters only the cluster that ran it would say 0.)
    assert sends() == {"alpine": 0, "cirrus": 0}
    (work / "weights.bin").write_bytes(b"v" * 50_000)
    (work / "notes.txt").write_bytes(b"n" * 700)
    assert sends() == {"alpine": 50_700, "cirrus": 50_700}  # what changed, counted by rsync itself


def test_a_sweeps_name_cancels_every_job_of_it_and_a_name_two_launches_share_is_refused(corral, clean_queues):
    """The queue shows a sweep as one row under its name; `corral cancel NAME` had refused it as "matches
    several jobs". Its id (the first job's) cancels that one job only, and says how to cancel the rest."""
    sweep = corral("launch", "-d", "--json", "-n", "lr-sweep", "--num-jobs", "3", "--infra", "slurm/cirrus/debug",
                   "--", "sleep 300")
    assert sweep.exit_code == 0, sweep.stderr
    ids = sorted(j["job_id"] for j in sweep.json())
    logs = corral("logs", "--no-follow", "lr-sweep")  # one job's output: which one is for the user to say
    assert logs.exit_code == 66 and "'lr-sweep' is a sweep" in logs.stderr and "corral queue -x" in logs.stderr
    assert corral("logs", "--no-follow", "-n", "lr-sweep").stderr == logs.stderr  # SkyPilot's --name, the same
    assert corral("logs", ids[0], "-n", "lr-sweep").exit_code == 2  # one job, named one way
    first = sweep.json()[0]["job_id"]  # the id the queue's sweep row shows
    one = corral("cancel", first)
    assert one.exit_code == 0 and one.stdout == f"{first}: cancelled\n", one.stderr
    assert one.stderr == (f"{first} is the first of the 3 jobs of a sweep (lr-sweep), and its id names that job "
                          "alone: `corral cancel lr-sweep` cancels them all\n")
    assert all(wait_state(corral, job_id, {"PENDING", "RUNNING"}) for job_id in ids if job_id != first)
    cancelled = corral("cancel", "-n", "lr-sweep")  # as `sky jobs cancel -n NAME`
    assert cancelled.exit_code == 0, cancelled.stderr
    assert sorted(line.split(":")[0] for line in cancelled.stdout.splitlines()) == ids
    for job_id in ids:
        wait_state(corral, job_id, {"CANCELLED"})
    for _ in range(2):
        assert corral("launch", "-d", "-n", "twice", "--infra", "slurm/cirrus/debug", "--", "true").exit_code == 0
    refused = corral("cancel", "twice")
    assert refused.exit_code == 66 and "'twice' matches several jobs" in refused.stderr
