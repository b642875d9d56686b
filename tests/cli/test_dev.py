"""Dev allocations: `launch -c`, `exec`, `ssh`, `status`, `down`, idle autodown, on the real testbed."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pexpect
import pytest

from tests.conftest import wait_for
from tests.helpers import cancel_a_running_exec, free_port, job_state, runs_somewhere, ssh_login


@pytest.fixture
def clean(testbed, corral):
    yield
    for spec in testbed.clusters:
        subprocess.run(["ssh", "-F", str(testbed.cluster_config), spec.name, "scancel -u corral-test"],
                       capture_output=True)


def status(corral, name: str) -> dict:
    result = corral("status", "--json")
    assert result.exit_code == 0, result.stderr
    return next(s for s in result.json() if s["name"] == name)


def test_allocation_lands_where_capacity_is_and_exec_runs_on_every_node(corral, testbed, clean, tmp_path):
    full = ssh_login(testbed.cluster_config, "alpine",
                     "sbatch -o /dev/null --parsable -p gpu -N2 --gres=gpu:nvidia_h100_80gb_hbm3:4 --wrap 'sleep 600'").strip()
    wait_for("alpine to be full", lambda: job_state(testbed.cluster_config, "alpine", full) == "RUNNING")
    up = corral("launch", "-c", "dev", "--gpus", "H100:2", "--num-nodes", "2", "--json")
    assert up.exit_code == 0, up.stderr
    info = up.json()
    assert (info["cluster"], info["partition"], info["new"], info["nodes"]) == ("borealis", "h100-cluster", True,
                                                                               ["b1", "b2"])
    script = ('echo "rank=$CORRAL_NODE_RANK host=$(hostname) n=$CORRAL_NUM_NODES gpus=$CORRAL_NUM_GPUS_PER_NODE '
              'cvd=$CUDA_VISIBLE_DEVICES ips=$(echo $CORRAL_NODE_IPS | tr " " ,) cluster=$CORRAL_CLUSTER"')
    result = corral("exec", "dev", "--", script)
    assert result.exit_code == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [  # each line after its node's rank, as srun --label
        "0: rank=0 host=b1 n=2 gpus=2 cvd=0,1 ips=127.0.0.1,127.0.0.1 cluster=borealis",
        "1: rank=1 host=b2 n=2 gpus=2 cvd=0,1 ips=127.0.0.1,127.0.0.1 cluster=borealis",
    ]
    failed = corral("exec", "dev", "--", "exit 4")
    assert failed.exit_code == 4
    assert "Terminating StepId" not in failed.stdout + failed.stderr  # srun's own informational line (--quiet)
    # One node fails while the other runs, which is ended for it (--kill-on-bad-exit): the failure's own
    # status wins. Rank 1 fails only once rank 0 runs: a task that Slurm launches while it is killing the
    # step can miss the kill and run to its end (CI caught one on a loaded host).
    one_fails = corral("exec", "dev", "--", 'if [ "$CORRAL_NODE_RANK" = 1 ]; then '
                       'until [ -e "$CORRAL_TASK_ID.runs" ]; do sleep 0.1; done; exit 3; fi; '
                       ': > "$CORRAL_TASK_ID.runs"; sleep 60')
    assert (one_fails.exit_code, one_fails.seconds < 50) == (3, True), one_fails.stderr
    # The task's PATH is the task's: exec's own srun and node-list code on the login node still run.
    no_path = corral("exec", "dev", "--env", "PATH=/nowhere", "--", 'echo "path=$PATH"')
    assert no_path.exit_code == 0, no_path.stderr
    assert sorted(no_path.stdout.splitlines()) == ["0: path=/nowhere", "1: path=/nowhere"]
    jobs = corral("queue", "dev", "--json").json()
    assert [(j["state"], j["exit_code"]) for j in jobs] == [("SUCCEEDED", 0), ("FAILED", 3), ("FAILED", 4),
                                                              ("SUCCEEDED", 0)]
    assert all(j["cluster"] == "borealis" for j in jobs)
    # An exec's output is kept in the allocation: `logs` shows it (not the holder's log), and the exec's end.
    kept = corral("logs", jobs[0]["job_id"])
    assert (kept.exit_code, kept.stdout) == (0, no_path.stdout), kept.stderr
    assert corral("logs", jobs[1]["job_id"]).exit_code == 3
    assert corral("logs", "dev").stdout == kept.stdout  # the allocation's newest job, as `sky logs CLUSTER`
    # Its stderr too, as in a job's log (it was dropped before).
    loud = corral("exec", "dev", "--", 'echo "to stderr $CORRAL_NODE_RANK" >&2')
    assert sorted(loud.stdout.splitlines()) == ["0: to stderr 0", "1: to stderr 1"], loud.stderr
    # What a node's command leaves running ends with it, as under Slurm's proctrack/cgroup: the testbed's
    # proctrack/linuxproc lets it hold the step's output, and so the exec, open for its whole life.
    left = corral("exec", "dev", "--", "sleep 3021 & echo left")
    assert (left.exit_code, sorted(left.stdout.splitlines()), left.seconds < 20) == (0, ["0: left", "1: left"], True), \
        left.stderr
    wait_for("the sleeps it left to end", lambda: not runs_somewhere("sleep", "3021"), timeout=15)
    # A task's num_nodes (or --num-nodes) runs it on that many of the nodes, as `sky exec` does.
    fewer = corral("exec", "dev", "--num-nodes", "1", "--", script)
    assert (fewer.exit_code, fewer.stdout) == (
        0, "rank=0 host=b1 n=1 gpus=2 cvd=0,1 ips=127.0.0.1 cluster=borealis\n"), fewer.stderr
    more = corral("exec", "dev", "--num-nodes", "3", "--", "true")
    assert more.exit_code == 65 and "the task asks for 3 nodes; allocation 'dev' has 2" in more.stderr
    # A task asking for GPUs the allocation does not hold is refused, as `sky exec` refuses it (it ran).
    greedy = tmp_path / "greedy.yaml"
    greedy.write_text("resources:\n  accelerators: H100:4\nrun: nvidia-smi\n")
    refused = corral("exec", "dev", str(greedy))
    assert refused.exit_code == 65 and ("allocation 'dev' cannot run this task: it asks for H100:4 (it holds 2 GPUs "
                                        "(H100) per node)") in refused.stderr, refused.stderr
    # So is one asking for more CPUs than Slurm gave it (held without --cpus: one here), or another cluster.
    greedy.write_text("resources:\n  cpus: 4\n  infra: slurm/alpine\nrun: nproc\n")
    refused = corral("exec", "dev", str(greedy))
    assert refused.exit_code == 65 and ("it asks for cpus=4 (it was held without a number of cpus; the infra gave "
                                        "it 1 per node); infra slurm/alpine (it is on slurm/borealis/h100-cluster)"
                                        ) in refused.stderr, refused.stderr
    greedy.write_text("resources:\n  accelerators: [H100:4, H100:1]\nrun: echo fits\n")  # one alternative fits
    assert corral("exec", "dev", "--num-nodes", "1", str(greedy)).stdout == "fits\n"
    # Same name, same resources: reused, no second allocation; the task just runs in it.
    again = corral("launch", "-c", "dev", "--gpus", "H100:2", "--num-nodes", "2", "--", "hostname")
    assert again.exit_code == 0, again.stderr
    assert sorted(again.stdout.splitlines()) == ["0: b1", "1: b2"]
    assert status(corral, "dev")["slurm_job_id"] == info["slurm_job_id"]
    # As `sky launch` on a live cluster: the task's setup runs again on every node, then its run on the
    # task's num_nodes (1 of the 2). It was refused ("other resources") and setup did not run again.
    task = tmp_path / "again.yaml"
    task.write_text("resources:\n  accelerators: H100:2\nnum_nodes: 1\n"
                    'setup: echo "setup on $(hostname)"\nrun: echo "run on $(hostname)"\n')
    relaunch = corral("launch", "-c", "dev", str(task))
    assert relaunch.exit_code == 0, relaunch.stderr
    lines = relaunch.stdout.splitlines()
    assert (sorted(lines[:2]), lines[2:]) == (["0: setup on b1", "1: setup on b2"], ["run on b1"]), relaunch.stdout
    relaunched = corral("queue", "dev", "--json").json()[0]
    assert corral("logs", relaunched["job_id"]).stdout == relaunch.stdout  # both kept, in the job's output
    assert corral("launch", "-c", "dev", str(task), "--no-setup").stdout == "run on b1\n"
    # -d (`sky launch -d`): returns once the run has started, with its job id; it used to drop the run.
    detached = corral("launch", "-c", "dev", str(task), "-d", "--no-setup")
    assert detached.exit_code == 0 and f"{detached.stdout.strip()} started in dev" in detached.stderr, detached.stderr
    wait_for("the detached run's output", lambda: corral("logs", detached.stdout.strip()).stdout == "run on b1\n",
             timeout=30)
    # A setup that fails stops the run; the job fails with setup's status, and the allocation stays.
    task.write_text("resources:\n  accelerators: H100:2\nsetup: echo installing; exit 5\nrun: echo never\n")
    broken = corral("launch", "-c", "dev", str(task))
    assert (broken.exit_code, "never" in broken.stdout) == (5, False), broken.stdout + broken.stderr
    assert "setup failed with exit code 5; the run did not start" in broken.stdout + broken.stderr
    failed = corral("queue", "dev", "--json").json()[0]
    assert (failed["state"], failed["reason"], status(corral, "dev")["state"]) == (
        "FAILED", "setup failed; the run did not start", "READY")  # the queue used to give no reason
    # A `corral cancel` landing between setup's step and run's finds no step to scancel: the run started
    # regardless. Its marker now stops it (here setup leaves the marker itself, at its last moment: node 1
    # once node 0 is past its start, as a node that starts after the marker runs nothing).
    task.write_text("resources:\n  accelerators: H100:2\nrun: echo never\n"
                    'setup: |\n  echo set\n  e="$CORRAL_RUN_DIR/exec/$CORRAL_TASK_ID"\n'
                    '  if [ "$SLURM_NODEID" = 0 ]; then touch "$e/began"; exit 0; fi\n'
                    '  for i in $(seq 300); do [ -e "$e/began" ] && break; sleep 0.1; done\n'
                    '  touch "$e/cancelled"\n')
    late = corral("launch", "-c", "dev", str(task))
    assert (late.exit_code, sorted(late.stdout.splitlines())) == (143, ["0: set", "1: set"]), late.stdout + late.stderr
    more = corral("launch", "-c", "dev", str(task), "--num-nodes", "3")
    assert more.exit_code == 65 and "it asks for 3 nodes (it has 2)" in more.stderr, more.stderr
    # A task asking for less than is held runs in it, as `sky launch -c` runs one "less demanding than" the
    # cluster: fewer GPUs, a wider infra, or no resources at all. It was refused unless it asked for the same.
    for fewer in (["--gpus", "H100:1", "--infra", "slurm"], []):
        ran = corral("launch", "-c", "dev", *fewer, "--", "echo in dev")
        assert (ran.exit_code, sorted(ran.stdout.splitlines())) == (0, ["0: in dev", "1: in dev"]), ran.stderr
    other = corral("launch", "-c", "dev", "--gpus", "L40S:1")
    assert other.exit_code == 65
    assert ("allocation 'dev' (accelerator=H100:2, num_nodes=2) cannot run this task: it asks for L40S:1 (it holds "
            "2 GPUs (H100) per node). Use another name, or `corral down dev` first") in other.stderr, other.stderr
    down = corral("down", "dev")
    assert down.exit_code == 0 and down.stdout.strip() == "dev: released"
    assert job_state(testbed.cluster_config, "borealis", info["slurm_job_id"]) == "CANCELLED"
    gone = corral("down", "dev")
    assert gone.exit_code == 0 and gone.stderr.strip() == "dev: no such allocation (already down)"


def test_cancelling_an_exec_ends_it_and_keeps_its_allocation(corral, corral_env, clean):
    """`corral cancel` of a running exec (or `cancel -a`, which takes every live job) used to scancel the
    allocation's holder job: the exec's handle is the holder's."""
    up = corral("launch", "-c", "box", "--infra", "slurm/cirrus/debug", "--cpus", "1", "--json")
    assert up.exit_code == 0, up.stderr
    job_id = cancel_a_running_exec(corral, corral_env, "box")
    assert status(corral, "box")["state"] == "READY"
    after = corral("exec", "box", "--", "echo still here")
    assert (after.exit_code, after.stdout) == (0, "still here\n"), after.stderr
    # Ctrl-C on `corral exec` stops following it, not the exec (as on an attached launch); logs follows it again.
    runner = subprocess.Popen([sys.executable, "-m", "corral", "exec", "box", "--", "echo started; sleep 3; echo finished"],
                              env=corral_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert runner.stdout is not None and runner.stdout.readline() == "started\n"
        runner.send_signal(signal.SIGINT)
        _, err = runner.communicate(timeout=30)
    finally:
        runner.kill()
    [followed_id] = re.findall(r"corral: (c-[0-9a-f]+) keeps running in box; Ctrl-C only stopped following it", err)
    assert runner.returncode == 130 and f"`corral cancel {followed_id}` stops it" in err, err
    followed = corral("logs", followed_id)
    assert (followed.exit_code, followed.stdout) == (0, "started\nfinished\n"), followed.stderr
    # SkyPilot's forms for a cluster's jobs: `sky exec -d`, `sky logs CLUSTER JOB`, `sky cancel CLUSTER --all`.
    detached = corral("exec", "box", "-d", "--", "echo detached; sleep 120")
    assert detached.exit_code == 0, detached.stderr
    detached_id = detached.stdout.strip()
    assert re.fullmatch(r"c-[0-9a-f]+", detached_id) and f"{detached_id} started in box" in detached.stderr
    wait_for("the detached exec's output", lambda: corral("logs", "box", detached_id, "--no-follow").stdout
             == "detached\n", timeout=30)
    # `sky queue CLUSTER` numbers a cluster's jobs 1, 2, … and `sky logs`/`sky cancel CLUSTER N` take them.
    numbers = {j["job_id"]: j["number"] for j in corral("queue", "box", "--json").json()}
    assert sorted(numbers.values()) == list(range(1, len(numbers) + 1))
    assert numbers[detached_id] == len(numbers) and numbers[followed_id] == len(numbers) - 1
    assert corral("queue", "box").stdout.split()[:2] == ["#", "ID"]
    assert corral("logs", "box", str(numbers[detached_id]), "--no-follow").stdout == "detached\n"
    beyond = corral("logs", "box", str(len(numbers) + 1))
    assert beyond.exit_code == 66 and (f"dev allocation 'box' has no job {len(numbers) + 1}: its jobs are 1 to "
                                       f"{len(numbers)}") in beyond.stderr, beyond.stderr
    ended_one = corral("cancel", "box", str(numbers[followed_id]))
    assert ended_one.exit_code == 0 and ended_one.stdout.startswith(f"{followed_id}: already"), ended_one.stdout
    alone = corral("cancel", "box")
    assert alone.exit_code == 65 and "`corral cancel box --all` cancels the jobs running in it" in alone.stderr
    elsewhere = corral("launch", "-d", "--infra", "slurm/cirrus/debug", "--", "true").stdout.strip()
    for wrong in (corral("logs", "box", elsewhere, "--no-follow"), corral("cancel", "box", elsewhere)):
        assert wrong.exit_code in (65, 66) and f"{elsewhere} did not run in dev allocation 'box'" in wrong.stderr
    cancelled = corral("cancel", "box", "--all")
    assert (cancelled.exit_code, cancelled.stdout) == (0, f"{detached_id}: cancelled\n"), cancelled.stderr
    ended = corral("logs", "box", detached_id)
    assert ended.exit_code != 0 and "CANCELLED" in ended.stderr, ended.stderr
    assert status(corral, "box")["state"] == "READY"  # its jobs cancelled, the allocation kept
    assert corral("down", "box").exit_code == 0
    # Its output went with the allocation: `logs` says so.
    gone = corral("logs", job_id)
    assert gone.exit_code == 1 and "which has been released since" in gone.stderr, gone.stderr
    # A new allocation of that name numbers its own jobs from 1, as a new SkyPilot cluster does.
    assert corral("launch", "-c", "box", "--infra", "slurm/cirrus/debug", "--cpus", "1").exit_code == 0
    assert corral("exec", "box", "--", "echo anew").stdout == "anew\n"
    listed = corral("queue", "box", "--json").json()
    assert [j.get("number") for j in listed][0] == 1 and [j for j in listed if j.get("number")] == listed[:1]
    assert corral("logs", "box", "1", "--no-follow").stdout == "anew\n"
    assert corral("down", "box").exit_code == 0


def test_execs_naming_gpus_each_take_their_own_and_wait_for_them(corral, testbed, clean):
    """As SkyPilot's job queue on a cluster: two execs asking for 1 of the allocation's 2 GPUs each see
    a GPU of their own, a third waits (saying so) until one is free, a cancel ends it while it waits,
    and an exec naming no GPUs sees them all. Before, every exec saw every GPU."""
    up = corral("launch", "-c", "share", "--gpus", "H100:2", "--infra", "slurm/alpine", "--json")
    assert up.exit_code == 0, up.stderr
    hold = 'echo "$CORRAL_TASK_ID cvd=$CUDA_VISIBLE_DEVICES n=$CORRAL_NUM_GPUS_PER_NODE"; ' \
           'until [ -e "$CORRAL_RUN_DIR/go" ]; do sleep 0.1; done'

    def detached(*args: str) -> str:
        result = corral("exec", "share", "-d", "--gpus", "H100:1", *args)
        assert result.exit_code == 0, result.stderr
        return result.stdout.strip()

    def output(job_id: str) -> str:
        return corral("logs", job_id, "--no-follow").stdout

    seen = corral("exec", "share", "--", "echo $CUDA_VISIBLE_DEVICES")
    assert seen.exit_code == 0, seen.stderr
    devices = seen.stdout.strip().split(",")  # the node's GPUs that Slurm gave the allocation
    assert len(devices) == 2, seen.stdout
    first, second = detached("--", hold), detached("--", hold)
    shown = wait_for("both to print their GPUs", lambda: (a := output(first)) and (b := output(second)) and a + b,
                     timeout=60)
    got = dict(line.split(" ", 1) for line in shown.splitlines())
    assert sorted(got) == sorted([first, second]) and \
        sorted(got.values()) == sorted(f"cvd={device} n=1" for device in devices), shown
    third, doomed = detached("--", "echo third cvd=$CUDA_VISIBLE_DEVICES"), detached("--", "echo never")
    waiting = "corral: waiting for 1 of the allocation's 2 GPUs per node, in use by job(s) "
    wait_for("the third to say it waits", lambda: output(third).startswith(waiting), timeout=60)
    assert sorted(output(third).split("job(s) ")[1].split()) == sorted([first, second])

    def queued(job_id: str) -> dict:
        return next(j for j in corral("queue", "share", "--json").json() if j["job_id"] == job_id)

    # PENDING while it waits, as `sky queue` shows a job waiting for its GPUs (it used to say RUNNING).
    shown = wait_for("the third to show PENDING", lambda: (j := queued(third))["state"] == "PENDING" and j,
                     timeout=30)
    assert shown["reason"].startswith(waiting.removeprefix("corral: ")) and shown["started_at"] is None, shown
    assert sorted(shown["reason"].split("job(s) ")[1].split()) == sorted([first, second]), shown
    cancelled = corral("cancel", doomed)
    assert cancelled.exit_code == 0, cancelled.stderr
    ended = corral("logs", doomed)
    assert ended.exit_code != 0 and "CANCELLED" in ended.stderr and "never" not in ended.stdout, ended.stderr
    everything = corral("exec", "share", "--", 'echo "all=$CUDA_VISIBLE_DEVICES"; touch "$CORRAL_RUN_DIR/go"')
    assert (everything.exit_code, everything.stdout) == (0, f"all={seen.stdout.strip()}\n"), everything.stderr
    finished = corral("logs", third)
    assert finished.exit_code == 0, finished.stderr
    assert re.fullmatch(re.escape(waiting) + r".*\ncorral: its GPUs are free after \d+ s; starting\nthird cvd=("
                        + "|".join(devices) + r")\n", finished.stdout), finished.stdout
    ran = queued(third)
    assert (ran["state"], ran["reason"], ran["started_at"] is not None) == ("SUCCEEDED", None, True), ran
    # Held without --cpus: a task's cpus count against what Slurm gave it (they used to be refused outright).
    given = status(corral, "share")
    cpus = ssh_login(testbed.cluster_config, "alpine", f"squeue -h -j {given['slurm_job_id']} -o %C").strip()
    assert given["cpus_per_node"] == int(cpus) and given["memory_gb_per_node"], given
    fits = corral("exec", "share", "--cpus", cpus, "--", "echo fits")
    assert (fits.exit_code, fits.stdout) == (0, "fits\n"), fits.stderr
    more = corral("exec", "share", "--cpus", str(int(cpus) + 1), "--", "echo never")
    assert more.exit_code == 65 and f"the infra gave it {cpus} per node" in more.stderr, more.stderr
    assert corral("down", "share").exit_code == 0


def test_an_exec_whose_end_its_server_did_not_see_is_settled_from_the_allocation(corral, corral_env, clean):
    """kill -9 of the server during an exec left the exec RUNNING in the queue for ever."""
    up = corral("launch", "-c", "box2", "--infra", "slurm/cirrus/debug", "--cpus", "1", "--json")
    assert up.exit_code == 0, up.stderr

    def exec_then_kill_the_server(command: str) -> str:
        runner = subprocess.Popen([sys.executable, "-m", "corral", "exec", "box2", "--", command], env=corral_env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert runner.stdout is not None and runner.stdout.readline() == "started\n"
            os.kill(int((Path(corral_env["CORRAL_HOME"]) / "controller.pid").read_text()), signal.SIGKILL)
            _, err = runner.communicate(timeout=60)
        finally:
            runner.kill()
        assert runner.returncode == 69 and "the server stopped answering" in err, err
        [job] = corral("queue", "box2", "-s", "--json").json()  # a new server: the exec is still RUNNING
        assert job["state"] == "RUNNING"
        return job["job_id"]

    def queued(job_id: str) -> dict:
        return next(j for j in corral("queue", "box2", "--json").json() if j["job_id"] == job_id)

    job_id = exec_then_kill_the_server("echo started; sleep 2; exit 5")
    ended = wait_for("the exec's end to be read from the allocation", lambda: status(corral, "box2")
                     and (j := queued(job_id))["state"] != "RUNNING" and j, timeout=60, interval=1)
    assert (ended["state"], ended["exit_code"]) == ("FAILED", 5)
    assert status(corral, "box2")["state"] == "READY"
    job_id = exec_then_kill_the_server("echo started; sleep 300")
    assert corral("down", "box2").exit_code == 0
    released = queued(job_id)
    assert (released["state"], released["reason"]) == ("CANCELLED", "its allocation 'box2' was released")


def test_an_exec_outlives_a_stopped_server_with_all_its_output(corral, testbed, clean):
    """`corral server stop` during an exec marked it FAILED ("interrupted") while it ran on, and the
    output it printed after was lost (its `tee` died with the session)."""
    up = corral("launch", "-c", "box3", "--infra", "slurm/cirrus/debug", "--cpus", "1", "--json")
    assert up.exit_code == 0, up.stderr
    job_id = corral("exec", "box3", "-d", "--", "echo one; sleep 3; echo two; exit 3").stdout.strip()
    wait_for("its first line", lambda: corral("logs", job_id, "--no-follow").stdout == "one\n", timeout=30)
    assert corral("server", "stop").exit_code == 0
    marker = f"cat .corral/runs/*/exec/{job_id}/ended 2>/dev/null; true"
    wait_for("the exec's end on the cluster", lambda: ssh_login(testbed.cluster_config, "cirrus", marker).strip(),
             timeout=60, interval=0.5)

    def settled() -> dict | None:  # by the new server's first tick: no `corral status` asked
        job = next(j for j in corral("queue", "box3", "--json").json() if j["job_id"] == job_id)
        return job if job["state"] != "RUNNING" else None

    ended = wait_for("the new server to settle it", settled, timeout=60, interval=0.5)
    assert (ended["state"], ended["exit_code"], ended["reason"]) == ("FAILED", 3, None)
    output = corral("logs", job_id, "--no-follow").stdout
    assert output.startswith("one\ntwo\n") and "Exited with exit code 3" in output, output  # srun's line too


def test_ssh_into_the_head_node(corral, corral_env, testbed, clean, tmp_path):
    up = corral("launch", "-c", "box", "--infra", "slurm/cirrus/b300", "--num-nodes", "2", "--json")
    assert up.exit_code == 0, up.stderr
    result = corral("ssh", "box", "--", "hostname")
    assert result.exit_code == 0 and result.stdout.strip() == "c1"
    shell = pexpect.spawn(sys.executable, ["-m", "corral", "ssh", "box"], env=corral_env, encoding="utf-8",
                          timeout=30)
    try:
        shell.sendline("echo marker-$(hostname)-$SLURM_JOB_ID")
        shell.expect(rf"marker-c1-{up.json()['slurm_job_id']}")
        shell.sendline("exit")
        shell.expect(pexpect.EOF)
    finally:
        shell.close(force=True)
    # The ssh alias file for plain `ssh box`: a real sshd on the head node, through the login node.
    alias = corral_env["CORRAL_HOME"] + "/ssh_config"
    text = open(alias).read()
    assert "Host box" in text and "ProxyCommand " in text and "RemoteCommand" not in text
    plain = pexpect.spawn("ssh", ["-F", alias, "box"], encoding="utf-8", timeout=30)
    try:
        plain.sendline("echo marker-$(hostname)-$SLURM_JOB_ID-$CORRAL_TASK_ID")
        plain.expect(rf"marker-c1-{up.json()['slurm_job_id']}-box")
        plain.sendline("exit")
        plain.expect(pexpect.EOF)
    finally:
        plain.close(force=True)
    check_editor_connections(alias, tmp_path)
    job = up.json()["slurm_job_id"]
    ssh_login(testbed.cluster_config, "cirrus", f"scancel {job}")
    wait_for("the allocation to end", lambda: status(corral, "box")["state"] == "ENDED")
    gone = subprocess.run(["ssh", "-F", alias, "box", "true"], capture_output=True, text=True, timeout=30)
    assert gone.returncode == 255
    assert f"corral: dev allocation box (Slurm job {job}) is not running; see `corral status box`" in gone.stderr
    assert corral("down", "box").exit_code == 0
    assert "Host box" not in open(alias).read()
    assert "corral-dev-" not in open(corral_env["CORRAL_HOME"] + "/known_hosts").read()


def check_editor_connections(alias: str, tmp_path) -> None:
    """What editors' remote-SSH does over the alias: a script on stdin without a tty (how VS Code
    installs and starts its server), file transfer over sftp, and local and dynamic port forwarding."""
    ssh = ["ssh", "-F", alias]
    script = subprocess.run([*ssh, "-T", "box", "bash"], input="echo on-$(hostname)\nexit 3\n", capture_output=True,
                            text=True, timeout=30)
    assert (script.returncode, script.stdout) == (3, "on-c1\n"), script.stderr
    blob = tmp_path / "blob"
    blob.write_bytes(bytes(range(256)) * 4096)
    back = tmp_path / "back"
    sftp = subprocess.run(["sftp", "-F", alias, "-b", "-", "box"], capture_output=True, text=True, timeout=30,
                          input=f"put {blob} corral-blob\nget corral-blob {back}\nrm corral-blob\n")
    assert sftp.returncode == 0, sftp.stderr
    assert back.read_bytes() == blob.read_bytes()
    # A web server on the head node, reached through `-L` and through `-D` (SOCKS), as editors do.
    remote_port, local_port, socks_port = free_port(), free_port(), free_port()
    server = subprocess.Popen(
        [*ssh, "-L", f"{local_port}:127.0.0.1:{remote_port}", "box",
         f"mkdir -p corral-www && hostname > corral-www/who && cd corral-www && "
         f"exec timeout 60 python3 -m http.server {remote_port} --bind 127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    socks = subprocess.Popen([*ssh, "-N", "-D", f"127.0.0.1:{socks_port}", "box"], stderr=subprocess.DEVNULL)
    try:
        assert wait_for("the forwarded port to answer", lambda: fetch(f"http://127.0.0.1:{local_port}/who")) == "c1\n"
        via_socks = wait_for("the SOCKS proxy to answer", lambda: fetch_via_socks(socks_port, remote_port, "/who"))
        assert via_socks.endswith(b"\r\n\r\nc1\n")
    finally:
        server.terminate()
        socks.terminate()
        server.wait(10)
        socks.wait(10)



def fetch_via_socks(socks_port: int, port: int, path: str) -> bytes | None:
    """HTTP GET 127.0.0.1:port through a SOCKS5 proxy (RFC 1928, no authentication)."""
    try:
        with socket.create_connection(("127.0.0.1", socks_port), timeout=5) as conn:
            conn.sendall(b"\x05\x01\x00")
            if conn.recv(2) != b"\x05\x00":
                return None
            conn.sendall(b"\x05\x01\x00\x01" + socket.inet_aton("127.0.0.1") + port.to_bytes(2, "big"))
            reply = conn.recv(10)
            if len(reply) < 2 or reply[1] != 0:
                return None
            conn.sendall(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
            chunks = []
            while chunk := conn.recv(65536):
                chunks.append(chunk)
            return b"".join(chunks)
    except OSError:
        return None


def fetch(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.read().decode()
    except OSError:
        return None


def test_idle_autodown_but_not_while_an_exec_job_or_ssh_session_runs(corral, corral_env, clean):
    up = corral("launch", "-c", "idler", "--infra", "slurm/alpine/cpu", "--idle-minutes", "0.25", "--json")
    assert up.exit_code == 0, up.stderr
    # Each longer than the 15 s idle limit: an exec job, then a plain ssh session through the alias.
    busy = corral("exec", "idler", "--", "sleep 20; echo done")
    assert busy.exit_code == 0 and busy.stdout.strip() == "done"
    assert status(corral, "idler")["state"] == "READY"
    session = subprocess.run(["ssh", "-F", corral_env["CORRAL_HOME"] + "/ssh_config", "idler", "sleep 20; echo in"],
                             capture_output=True, text=True, timeout=60)
    assert (session.returncode, session.stdout) == (0, "in\n"), session.stderr
    assert status(corral, "idler")["state"] == "READY"
    ended = wait_for("the idle allocation to be released",
                     lambda: (s := status(corral, "idler"))["state"] == "ENDED" and s, timeout=60)
    assert ended["reason"] == "released after being idle"


def test_node_death_and_walltime_end_are_shown(corral, testbed, clean):
    short = corral("launch", "-c", "short", "--infra", "slurm/cirrus/debug", "--time", "1", "--json")
    assert short.exit_code == 0, short.stderr
    doomed = corral("launch", "-c", "doomed", "--infra", "slurm/alpine/inference", "--json")
    assert doomed.exit_code == 0, doomed.stderr
    testbed.kill_node("a4")
    try:
        failed = wait_for("the node failure to show", lambda: (s := status(corral, "doomed"))["state"] != "READY" and s,
                          timeout=120, interval=2)
        assert (failed["state"], failed["reason"]) == ("FAILED", "a node failed")
        timed_out = wait_for("the walltime to end", lambda: (s := status(corral, "short"))["state"] != "READY" and s,
                             timeout=120, interval=2)
        assert (timed_out["state"], timed_out["reason"]) == ("ENDED", "walltime ended")
        exec_after = corral("exec", "short", "--", "true")  # says why, as `exec -d` does, not "not ready"
        assert exec_after.exit_code == 69
        assert exec_after.stderr.strip() == ("corral: error: allocation 'short' is ENDED (walltime ended); see "
                                             "`corral status short`")
        [tried] = corral("queue", "short", "--json").json()
        assert (tried["state"], tried["reason"]) == ("FAILED", "allocation ENDED")
    finally:
        testbed.start_node("a4")
        testbed.resume("a4")


def test_a_failed_setup_says_what_it_printed(corral, clean, tmp_path):
    """`launch -c` with a failing setup said only its exit code; its output was in the holder's log,
    which no command showed."""
    task = tmp_path / "task.yaml"
    task.write_text("setup: |\n  echo installing\n  echo 'pip: no such package' >&2\n  exit 4\nrun: echo hi\n")
    failed = corral("launch", "-c", "broken", str(task), "--infra", "slurm/cirrus/debug", "--cpus", "1")
    assert failed.exit_code == 1, failed.stderr
    # shown as it ran, as `sky launch -c` shows setup's output; the error then does not repeat it
    assert "installing\n" in failed.stdout and "pip: no such package" in failed.stdout, failed.stdout
    assert "allocation 'broken' is FAILED: setup failed with exit code 4; its output is above" in failed.stderr
    assert "installing" not in failed.stderr, failed.stderr
    assert "pip: no such package" in status(corral, "broken")["setup_output"]
    assert corral("down", "broken").exit_code == 0
    # --no-setup: a new allocation is held without running it (as `sky launch --no-setup`)
    skipped = corral("launch", "-c", "nosetup", str(task), "--infra", "slurm/cirrus/debug", "--cpus", "1", "--no-setup")
    assert (skipped.exit_code, skipped.stdout) == (0, "hi\n"), skipped.stderr
    # Where it was not shown (`launch -c` again while the first, detached, runs setup), the error gives
    # its last lines.
    task.write_text("setup: |\n  echo installing\n  sleep 3\n  echo 'pip: no such package' >&2\n  exit 4\n")
    first = corral("launch", "-c", "broken2", str(task), "--infra", "slurm/cirrus/debug", "--cpus", "1", "-d")
    assert first.exit_code == 0, first.stderr
    again = corral("launch", "-c", "broken2", "--infra", "slurm/cirrus/debug", "--cpus", "1")
    assert again.exit_code == 1 and "installing" not in again.stdout, again.stdout
    assert ("allocation 'broken2' is FAILED: setup failed with exit code 4; the last lines setup printed: "
            "installing | pip: no such package | ") in again.stderr, again.stderr
    assert corral("down", "broken2", "nosetup").exit_code == 0


def test_unknown_allocation_names_the_known_ones(corral, clean):
    assert corral("launch", "-c", "known", "--infra", "slurm/alpine/cpu", "-d").exit_code == 0
    result = corral("exec", "nope", "--", "true")
    assert result.exit_code == 66
    assert result.stderr.strip() == ("corral: error: no dev allocation 'nope'; allocations: known "
                                     "(create one with `corral launch -c nope`)")
    assert "no dev allocation 'nope'" in corral("ssh", "nope").stderr
    assert corral("launch", "-c", "bad name!").stderr.strip().startswith("corral: error: invalid allocation name")
    corral("down", "known")


def test_a_holder_whose_scancel_was_lost_releases_its_nodes(corral, testbed, clean):
    """`corral down` leaves the cancel marker before its scancel: a holder that missed the kill (lost
    on the way, or sent while the job was being launched) sees the marker and ends by itself."""
    up = corral("launch", "-c", "fence", "--gpus", "L4:1", "--idle-minutes", "60", "--json")
    assert up.exit_code == 0, up.stderr
    info = up.json()
    run_dir = ssh_login(testbed.cluster_config, info["cluster"],
                        f"scontrol show job {info['slurm_job_id']} | sed -n 's/.*WorkDir=//p'").strip()
    assert run_dir.endswith(tuple("0123456789abcdef")), run_dir
    ssh_login(testbed.cluster_config, info["cluster"], f": > {run_dir}/cancelled")  # down's first step, no scancel
    wait_for("the holder to end by itself", lambda: job_state(testbed.cluster_config, info["cluster"],
                                                              info["slurm_job_id"]) in ("COMPLETED", ""), 40)
    assert status(corral, "fence")["state"] == "ENDED"


def test_a_tasks_skypilot_autostop_is_the_allocations_idle_limit(corral, clean, tmp_path):
    task = tmp_path / "dev.yaml"
    task.write_text("resources:\n  infra: slurm/alpine/cpu\n  cpus: 1\n  autostop: 2h\n  use_spot: true\n")
    up = corral("launch", "-c", "box", str(task), "-d", "--json")
    assert up.exit_code == 0, up.stderr
    assert "resources.use_spot: ignored on Slurm" in up.stderr and "resources.autostop" not in up.stderr  # honoured
    assert status(corral, "box")["idle_limit_seconds"] == 2 * 3600
    flag = corral("launch", "-c", "box2", str(task), "-i", "3", "-d", "--json")  # SkyPilot's -i
    assert flag.exit_code == 0, flag.stderr
    assert status(corral, "box2")["idle_limit_seconds"] == 180  # -i wins over the task
    # `sky autostop` on live allocations: the holder takes the new limit, counted from now, with no
    # server needed. box is released after 6 idle seconds (its 2 h limit would have kept it).
    wait_for("box to be ready", lambda: status(corral, "box")["state"] == "READY", timeout=60)
    never = corral("autostop", "box2", "--cancel")
    assert (never.exit_code, never.stdout) == (0, "box2: never released for being idle\n"), never.stderr
    assert status(corral, "box2")["idle_limit_seconds"] is None  # none: never
    soon = corral("autostop", "box", "-i", "0.1", "--down")
    assert (soon.exit_code, soon.stdout) == (0, "box: released once idle for 0.1 min\n"), soon.stderr
    released = wait_for("box to be released for being idle", lambda: (s := status(corral, "box"))["state"] == "ENDED"
                        and s, timeout=60)
    assert released["reason"] == "released after being idle" and status(corral, "box2")["state"] != "ENDED"
    ended = corral("autostop", "box")
    assert ended.exit_code == 1 and "box is ENDED: nothing to release" in ended.stderr, ended.stderr
    relaunch = corral("launch", "-c", "box2", str(task), "-i", "30", "-d")  # `sky launch -c NAME -i M` on a live one
    assert relaunch.exit_code == 0 and status(corral, "box2")["idle_limit_seconds"] == 1800, relaunch.stderr
    # `sky launch -c NAME --down`: autodown once its jobs are done (it was refused)
    autodown = corral("launch", "-c", "box3", "--infra", "slurm/alpine/cpu", "--cpus", "1", "--down", "-d")
    assert autodown.exit_code == 0 and "box3 is released once nothing has run in it for 1 minute" in autodown.stderr
    assert status(corral, "box3")["idle_limit_seconds"] == 60
    down = corral("down", "-a", "-y")  # `sky down -a -y`: every allocation of yours
    assert (down.exit_code, sorted(down.stdout.splitlines())) == (
        0, ["box2: released", "box3: released", "box: released"]), down.stderr
    assert corral("status", "--json").json() == []
    again = corral("down", "--all")
    assert again.exit_code == 0 and "no dev allocations to release" in again.stderr


def test_a_new_allocation_leaves_out_a_cluster_whose_status_query_is_overdue(corral, testbed, clean):
    """cirrus' slurmctld frozen while the server tracks a job there: once cirrus' status query has gone
    3 s unanswered, a new allocation that may go anywhere (and a launch's plan) leaves cirrus out and
    says why, instead of probing it: its `scontrol ping` would take 5 s to give up."""
    there = corral("launch", "-d", "--infra", "slurm/cirrus", "--cpus", "1", "--", "sleep 300")
    assert there.exit_code == 0, there.stderr
    testbed.freeze_controller("cirrus")
    try:
        wait_for("cirrus' status query to go 3 s unanswered",
                 lambda: re.search(r"cirrus: no answer in [3-9]", corral("queue").stderr), timeout=40)
        left_out = "cirrus: its status query has had no answer in"
        plan = corral("launch", "--dryrun", "--cpus", "1", "--", "true")
        assert (plan.exit_code, left_out in plan.stdout) == (0, True), plan.stdout + plan.stderr
        up = corral("launch", "-c", "dev", "--cpus", "1")
        assert (up.exit_code, left_out in up.stderr) == (0, True), up.stdout + up.stderr
        assert re.search(r"dev is ready on slurm/(alpine|borealis)/", up.stderr), up.stderr
    finally:
        testbed.thaw_controller("cirrus")


def test_a_detached_run_on_a_pending_allocation_is_queued_until_it_is_ready(corral, corral_env, testbed, clean):
    """`launch -c NAME -d` waited for as long as Slurm kept the allocation pending (hours, on a busy
    cluster), and `exec -d` on a pending one gave a job that then failed. Now the run is queued in the
    server, which starts it once the allocation is ready (after a server restart too); a cancel or a
    `down` ends it before it reaches the cluster."""
    config = testbed.cluster_config
    blocker = ssh_login(config, "cirrus", "sbatch --parsable -p debug --exclusive -t 10 --wrap 'sleep 600'").strip()
    wait_for("the blocker to run", lambda: job_state(config, "cirrus", blocker) == "RUNNING", timeout=60)

    def job(job_id: str) -> dict:
        return next(j for j in corral("queue", "--json").json() if j["job_id"] == job_id)

    queued = corral("launch", "-c", "later", "--infra", "slurm/cirrus/debug", "-d", "--", "echo ran in $CORRAL_CLUSTER")
    assert queued.exit_code == 0, queued.stderr
    first = queued.stdout.strip()
    assert f"{first} queued in later: it starts once later is ready, now PENDING (" in queued.stderr, queued.stderr
    assert status(corral, "later")["state"] == "PENDING"
    waiting = job(first)
    assert waiting["state"] == "PENDING" and waiting["submitted_at"] is None, waiting
    assert waiting["reason"].startswith("waiting for its allocation later to be ready (PENDING"), waiting
    # Slurm's estimate of when it starts, as the queue shows it for any pending job
    wait_for("Slurm's estimate", lambda: status(corral, "later")["expected_start"], timeout=60, interval=1)

    doomed = corral("exec", "later", "-d", "--", "echo never")
    assert doomed.exit_code == 0 and "queued in later" in doomed.stderr, doomed.stderr
    assert corral("cancel", doomed.stdout.strip()).exit_code == 0
    assert job(doomed.stdout.strip())["state"] == "CANCELLED"
    # A queued exec of an allocation taken down is cancelled with it.
    other = corral("launch", "-c", "other", "--infra", "slurm/cirrus/debug", "-d", "--", "echo never")
    assert other.exit_code == 0 and "queued in other" in other.stderr, other.stderr
    assert corral("down", "other").exit_code == 0
    gone = job(other.stdout.strip())
    assert (gone["state"], gone["reason"]) == ("CANCELLED", "its allocation 'other' was released"), gone

    # Attached, it waits; Ctrl-C then says the allocation stays queued (it said "interrupted"), and its
    # run is queued as with -d (it used to wait in the server's memory, in no queue, beyond any cancel).
    attached = pexpect.spawn(sys.executable, ["-m", "corral", "launch", "-c", "waits", "--infra", "slurm/cirrus/debug",
                                              "--", "echo never"], env=corral_env, encoding="utf-8", timeout=60)
    attached.expect(r"corral: waits: PENDING \(")
    attached.kill(signal.SIGINT)
    attached.expect(pexpect.EOF)
    attached.close()
    assert attached.exitstatus == 130, attached.before
    assert "Ctrl-C stopped waiting, not the allocation: waits stays in Slurm's queue (PENDING (" in attached.before
    assert "the task is queued in it and starts once it is ready (`corral queue waits`)" in attached.before
    assert status(corral, "waits")["state"] == "PENDING"
    left = wait_for("the run to be queued", lambda: corral("queue", "waits", "--json").json(), timeout=30)
    assert [(j["state"], j["reason"].split(" (")[0]) for j in left] == [
        ("PENDING", "waiting for its allocation waits to be ready")], left
    assert corral("down", "waits").exit_code == 0
    assert job(left[0]["job_id"])["state"] == "CANCELLED"

    # The queue is the server's: a restart keeps it.
    assert corral("server", "stop").exit_code == 0
    ssh_login(config, "cirrus", f"scancel {blocker}")
    ran = wait_for("the queued run to end", lambda: (j := job(first))["state"] in ("SUCCEEDED", "FAILED") and j,
                   timeout=120, interval=1)
    assert (ran["state"], ran["reason"], ran["started_at"] is not None) == ("SUCCEEDED", None, True), ran
    output = corral("logs", first)
    assert (output.exit_code, output.stdout) == (0, "ran in cirrus\n"), output.stderr
    assert corral("logs", doomed.stdout.strip(), "--no-follow").stdout == ""
    assert job(doomed.stdout.strip())["state"] == "CANCELLED"
    assert corral("down", "later").exit_code == 0


def test_an_attached_exec_on_a_pending_allocation_waits_in_the_queue_and_ends_as_its_run(corral, corral_env,
                                                                                           testbed, clean):
    """`corral exec NAME -- CMD` on an allocation still pending failed (exit 69) and left a FAILED job
    in the queue; it now queues the run, follows it, and exits with its exit code."""
    config = testbed.cluster_config
    blocker = ssh_login(config, "cirrus", "sbatch --parsable -p debug --exclusive -t 10 --wrap 'sleep 600'").strip()
    wait_for("the blocker to run", lambda: job_state(config, "cirrus", blocker) == "RUNNING", timeout=60)
    held = corral("launch", "-c", "soon", "--infra", "slurm/cirrus/debug", "-d")
    assert held.exit_code == 0 and status(corral, "soon")["state"] == "PENDING", held.stderr
    attached = subprocess.Popen([sys.executable, "-m", "corral", "exec", "soon", "--", "echo attached; exit 3"],
                                env=corral_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert attached.stderr is not None
    said = attached.stderr.readline()
    assert re.match(r"corral: c-\w+ queued in soon: it starts once soon is ready, now PENDING \(.*; following it",
                    said), said
    ssh_login(config, "cirrus", f"scancel {blocker}")
    out, err = attached.communicate(timeout=120)
    assert attached.returncode == 3 and out.startswith("attached\n"), (out, err)  # then srun's own error line
    job_id = said.split()[1]
    assert f"corral: {job_id} FAILED on slurm/cirrus/debug (exit code 3)" in err, err
    assert corral("down", "soon").exit_code == 0


IMAGE_TASK = """\
resources:
  image_id: docker:ubuntu:22.04
  cpus: 1
setup: echo "setup in ${CORRAL_TESTBED_CONTAINER:-no image}"
run: echo "run in ${CORRAL_TESTBED_CONTAINER:-no image}"
"""
IN_WHAT = 'echo "in ${CORRAL_TESTBED_CONTAINER:-no image} on $(hostname)"'


def test_an_allocation_with_an_image_runs_its_setup_execs_and_shells_in_it(corral, clean, tmp_path):
    """`launch -c` with an image ran its setup and execs on the host: the image was dropped unsaid. On the
    testbed, cirrus's Apptainer is a stand-in that names the image it was given (test_containers.py)."""
    task = tmp_path / "image.yaml"
    task.write_text(IMAGE_TASK)
    up = corral("launch", "-c", "boxed", str(task))
    assert up.exit_code == 0, up.stderr
    assert "setup in ubuntu:22.04\n" in up.stdout and up.stdout.endswith("run in ubuntu:22.04\n"), up.stdout
    held = status(corral, "boxed")
    assert (held["cluster"], held["image_id"]) == ("cirrus", "docker:ubuntu:22.04")  # the one with a runtime
    row = next(line for line in corral("status").stdout.splitlines() if "boxed" in line)
    assert "1x cpu, cpu=1, mem=" in row and ", image=ubuntu:22.04 " in row, row
    ran = corral("exec", "boxed", "--", IN_WHAT)
    assert ran.exit_code == 0 and ran.stdout.startswith("in ubuntu:22.04 on "), (ran.stdout, ran.stderr)
    shell = corral("ssh", "boxed", "--", IN_WHAT)
    assert shell.exit_code == 0 and shell.stdout.startswith("in ubuntu:22.04 on "), (shell.stdout, shell.stderr)
    # another image is not what it holds: refused, as a task asking for more GPUs than it holds is
    task.write_text(IMAGE_TASK.replace("ubuntu:22.04", "python:3.12-slim"))
    other = corral("exec", "boxed", str(task))
    assert other.exit_code != 0 and "image_id docker:python:3.12-slim (it runs in docker:ubuntu:22.04)" in \
        other.stderr, other.stderr
    again = corral("launch", "-c", "boxed", str(task))
    assert again.exit_code != 0 and "(it runs in docker:ubuntu:22.04)" in again.stderr, again.stderr
    assert corral("down", "boxed").exit_code == 0
    # without an image, the same commands run on the node itself
    plain = corral("launch", "-c", "bare", "--infra", "slurm/cirrus/debug", "--cpus", "1", "--", IN_WHAT)
    assert plain.exit_code == 0 and plain.stdout.startswith("in no image on "), plain.stdout
    assert corral("ssh", "bare", "--", IN_WHAT).stdout.startswith("in no image on ")
    assert corral("down", "bare").exit_code == 0
