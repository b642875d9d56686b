"""Managed jobs and the controller, on the real testbed: recovery, checkpoints, re-routing, restarts."""

from __future__ import annotations

import json
import os
import re
import sys
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.helpers import fill_h100s, job_state, ssh_login

FAST = {"CORRAL_CONTROLLER_INTERVAL": "1", "CORRAL_CONTROLLER_GRACE_SECONDS": "6",
        "CORRAL_CONTROLLER_REROUTE_AFTER": "2", "CORRAL_CONTROLLER_REROUTE_COOLDOWN": "60"}


@pytest.fixture
def env(corral_env, testbed):
    env = {**corral_env, **FAST}
    yield env
    subprocess.run([sys.executable, "-m", "corral", "server", "stop"], env=env, capture_output=True)
    for spec in testbed.clusters:
        subprocess.run(["ssh", "-F", str(testbed.cluster_config), spec.name, "scancel -u corral-test"],
                       capture_output=True)


def jobs(corral, env) -> dict[str, dict]:
    result = corral("jobs", "queue", "-a", "--json", env=env)
    assert result.exit_code == 0, result.stderr
    return {j["job_id"]: j for j in result.json()}


def all_succeeded(corral, env, ids: list[str]) -> bool:
    """One `jobs queue` for all of `ids` (not one per id: 200 of them took 45 s once every job had ended)."""
    states = {job_id: j["state"] for job_id, j in jobs(corral, env).items()}
    return all(states.get(i) == "SUCCEEDED" for i in ids)


def wait_job(corral, env, job_id: str, states: set[str], timeout: float = 90) -> dict:
    return wait_for(f"{job_id} to be {states}", lambda: (j := jobs(corral, env).get(job_id)) and
                    j["state"] in states and j, timeout)


def events(corral, env, job_id: str) -> list[dict]:
    return corral("jobs", "events", job_id, "--json", env=env).json()


def launch(corral, env, *args) -> str:
    result = corral("jobs", "launch", "--json", *args, env=env)
    assert result.exit_code == 0, result.stderr
    return result.json()["job_id"]


# Counts to `steps`, a second a step, from its checkpoint: an attempt that resumes does only what is left.
COUNTER_TASK = """\
name: {name}
resources:
  accelerators: {gpus}
  {extra}
run: |
  f="$CORRAL_CHECKPOINT_DIR/count"
  n=$(cat "$f" 2>/dev/null || echo 0)
  echo "attempt $CORRAL_ATTEMPT starts at $n on $(hostname) in $CORRAL_CLUSTER"
  while [ "$n" -lt {steps} ]; do n=$((n + 1)); echo $n > "$f"; sleep 1; done
  echo "attempt $CORRAL_ATTEMPT done at $n"
"""


def test_a_managed_job_runs_once_and_tells_its_story(corral, env):
    job = launch(corral, env, "--gpus", "H100:1", "--", "echo attempt=$CORRAL_ATTEMPT id=$CORRAL_TASK_ID; sleep 4")
    done = wait_job(corral, env, job, {"SUCCEEDED", "FAILED"})
    assert (done["state"], done["attempts"]) == ("SUCCEEDED", 1)
    states = [e["state"] for e in events(corral, env, job)]
    assert states[0] == "PENDING" and states[-1] == "SUCCEEDED" and "RUNNING" in states
    assert f"attempt=1 id={job}" in corral("jobs", "logs", "--no-follow", job, env=env).stdout
    status = corral("server", "status", env=env)
    assert status.exit_code == 0 and "controller running" in status.stdout


def test_a_managed_job_no_place_can_run_waits_and_why_lists_each_places_reason(corral, env):
    """Recorded all the same (a place may yet come back or change); `jobs why` had repeated its stored
    reason, every place on one line."""
    job = launch(corral, env, "--gpus", "B300:64", "--", "true")
    wait_for("the controller to find no place", lambda: (jobs(corral, env)[job]["reason"] or "").startswith(
        "no cluster can run it now: "), timeout=30)  # no reason yet until the controller's first tick
    head, *places = corral("jobs", "why", job, env=env).stdout.splitlines()
    assert head == f"{job} is PENDING: no cluster can run it now:"
    assert "  slurm/cirrus/b300: needs 1 node(s) with B300:64; partition has 0 (at most B300:8 a node)" in places
    assert "  slurm/alpine/gpu, slurm/borealis/h100-cluster: no B300 GPUs (has H100)" in places
    assert corral("jobs", "cancel", job, env=env).exit_code == 0


def test_task_failure_restarts_as_asked_then_fails(corral, env, tmp_path):
    task = tmp_path / "retry.yaml"
    task.write_text("resources:\n  infra: slurm/cirrus/debug\n  job_recovery:\n    max_restarts_on_errors: 1\n"
                    "run: |\n  echo attempt $CORRAL_ATTEMPT\n  exit 3\n")
    # Attached, as `sky jobs launch`: it follows the job through its restart and exits as the job ended.
    attached = corral("jobs", "launch", str(task), env=env)
    assert attached.exit_code == 3, attached.stderr
    assert attached.stdout == "attempt 1\nattempt 2\n"
    job = attached.stderr.split("managed job ", 1)[1].split()[0]
    assert re.search(rf"corral: {job} FAILED on slurm/cirrus/debug \(exit code 3, 2 attempts\)", attached.stderr)
    assert attached.stderr.index("== attempt 1") < attached.stderr.index("== attempt 2")
    done = jobs(corral, env)[job]
    assert done["state"] == "FAILED" and done["attempts"] == 2 and done["restarts_on_errors"] == 1
    assert "exit code 3" in done["reason"]
    followed = corral("jobs", "logs", job, env=env)  # follows by default: the ended job's whole story, its status
    assert (followed.exit_code, followed.stdout) == (3, "attempt 1\nattempt 2\n"), followed.stderr
    assert corral("jobs", "logs", "--no-follow", job, env=env).exit_code == 0
    status = corral("jobs", "logs", "--status", job, env=env)
    assert (status.exit_code, status.stdout) == (3, f"{job} FAILED on slurm/cirrus/debug (exit code 3)\n")
    latest = corral("jobs", "logs", "--no-follow", "--tail", "1", env=env)  # no JOB: the newest managed job
    assert (latest.exit_code, latest.stdout) == (0, "attempt 2\n"), latest.stderr  # the current attempt's end
    saved = corral("jobs", "logs", "-s", job, env={**env, "HOME": str(tmp_path)})  # a file per attempt
    folder = tmp_path / "corral_logs" / job
    assert (saved.exit_code, saved.stdout) == (0, f"{folder}/attempt-1.log\n{folder}/attempt-2.log\n"), saved.stderr
    assert [(folder / f"attempt-{n}.log").read_text() for n in (1, 2)] == ["attempt 1\n", "attempt 2\n"]


def test_ctrl_c_on_an_attached_managed_launch_stops_following_not_the_job(corral, env):
    proc = subprocess.Popen([sys.executable, "-m", "corral", "jobs", "launch", "--infra", "slurm/cirrus/debug", "--",
                             "echo started; sleep 600"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "started\n"  # it follows the running attempt
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    job = err.split("managed job ", 1)[1].split()[0]
    assert f"{job} keeps running" in err and f"`corral jobs cancel {job}`" in err
    assert wait_job(corral, env, job, {"RUNNING", "CANCELLED", "FAILED"})["state"] == "RUNNING"
    live = corral("jobs", "queue", "-s", "--json", env=env)  # `sky jobs queue -s`: the live ones only
    assert [j["job_id"] for j in live.json()] == [job], live.stdout
    cancelled = corral("jobs", "cancel", "-a", "-y", env=env)  # every live managed job, and only those
    assert (cancelled.exit_code, cancelled.stdout) == (0, f"{job}: cancelling\n"), cancelled.stderr
    unknown = corral("jobs", "cancel", "-n", "no-such-name", env=env)  # `sky jobs cancel -n NAME`
    assert unknown.exit_code == 66 and "no managed job 'no-such-name'" in unknown.stderr
    assert wait_job(corral, env, job, {"CANCELLED"})["state"] == "CANCELLED"


def test_a_managed_sweeps_first_id_cancels_that_job_alone_and_says_how_to_cancel_the_rest(corral, env):
    launched = corral("jobs", "launch", "-d", "--json", "-n", "mj-sweep", "--num-jobs", "2", "--infra",
                      "slurm/cirrus/debug", "--", "sleep 300", env=env)
    assert launched.exit_code == 0, launched.stderr
    first, second = launched.json()["job_ids"]
    one = corral("jobs", "cancel", first, env=env)
    assert (one.exit_code, one.stdout) == (0, f"{first}: cancelling\n"), one.stderr
    assert one.stderr == (f"{first} is the first of the 2 jobs of a sweep (mj-sweep), and its id names that job "
                          "alone: `corral jobs cancel mj-sweep` cancels them all\n")
    assert wait_job(corral, env, first, {"CANCELLED"})["state"] == "CANCELLED"
    assert wait_job(corral, env, second, {"PENDING", "RUNNING"})["state"] in ("PENDING", "RUNNING")
    rest = corral("jobs", "cancel", "mj-sweep", env=env)
    assert rest.exit_code == 0 and f"{second}: cancelling" in rest.stdout and not rest.stderr, rest.stderr
    assert wait_job(corral, env, second, {"CANCELLED"})["state"] == "CANCELLED"


def test_setup_failure_is_not_retried(corral, env, tmp_path):
    task = tmp_path / "setup.yaml"
    task.write_text("resources:\n  infra: slurm/cirrus/debug\n  job_recovery:\n    max_restarts_on_errors: 3\n"
                    "setup: exit 5\nrun: echo never\n")
    job = launch(corral, env, str(task))
    done = wait_job(corral, env, job, {"FAILED_SETUP", "FAILED"})
    assert (done["state"], done["attempts"]) == ("FAILED_SETUP", 1)
    assert done["reason"] == "setup failed on attempt 1 (exit code 5)"


def test_node_failure_resumes_from_the_checkpoint(corral, env, testbed, tmp_path):
    task = tmp_path / "counter.yaml"
    task.write_text(COUNTER_TASK.format(name="counter", gpus="gpu:2", extra="", steps=60))
    job = launch(corral, env, str(task))
    running = wait_job(corral, env, job, {"RUNNING"})
    cluster, slurm_id = running["cluster"], running["slurm_job_id"]
    node = ssh_login(testbed.cluster_config, cluster, f"squeue -h -j {slurm_id} -o %N").strip()
    wait_for("a few checkpoints", lambda: "starts at 0" in corral("jobs", "logs", "--no-follow", job, env=env).stdout, 30)
    wait_for("progress", lambda: ssh_login(testbed.cluster_config, cluster,
                                           f"cat .corral/checkpoints/{job}/count 2>/dev/null || echo 0").strip()
             not in ("0", "1", "2"), 30)
    testbed.kill_node(node)
    try:
        second = wait_for("attempt 2 to run", lambda: (j := jobs(corral, env)[job])["attempts"] >= 2 and
                          j["state"] == "RUNNING" and j, timeout=120, interval=1)
        assert second["slurm_job_id"] != slurm_id
        logs = wait_for("attempt 2 to report", lambda: (out := corral("jobs", "logs", "--no-follow", job, env=env).stdout)
                        and "attempt 2 starts at" in out and out, 60)
        resumed_at = int(logs.split("attempt 2 starts at ")[1].split()[0])
        assert resumed_at >= 3  # resumed from the checkpoint, not from zero
        story = " | ".join(f"{e['state']}: {e['reason']}" for e in events(corral, env, job))
        assert "RECOVERING" in story and "NODE_FAIL" in story, story
    finally:
        testbed.start_node(node)
        testbed.resume(node)


def test_job_recovery_none_leaves_a_node_failure_unrecovered(corral, env, testbed, tmp_path):
    task = tmp_path / "fragile.yaml"
    task.write_text("resources:\n  infra: slurm/cirrus/debug\n  job_recovery: none\nrun: sleep 300\n")
    job = launch(corral, env, str(task))
    running = wait_job(corral, env, job, {"RUNNING"})
    node = ssh_login(testbed.cluster_config, "cirrus", f"squeue -h -j {running['slurm_job_id']} -o %N").strip()
    testbed.scontrol("cirrus", "update", f"NodeName={node}", "State=DOWN", "Reason=corral-test")
    try:
        failed = wait_job(corral, env, job, {"FAILED", "RECOVERING"}, timeout=60)
        assert failed["state"] == "FAILED" and failed["attempts"] == 1, failed
        assert failed["reason"].endswith("not recovered (job_recovery: none)"), failed["reason"]
    finally:
        testbed.resume(node)


def test_pending_job_moves_to_the_cluster_that_frees_up(corral, env, testbed, tmp_path):
    config = testbed.cluster_config
    blocker_b = fill_h100s(config)["borealis"]
    task = tmp_path / "moving.yaml"
    task.write_text("name: moving\nresources:\n  ordered:\n    - {accelerators: 'H100:4', infra: slurm/alpine}\n"
                    "    - {accelerators: 'H100:4', infra: slurm/borealis}\nrun: echo ran on $CORRAL_CLUSTER\n")
    job = launch(corral, env, str(task))
    pending = wait_for("the job to wait on alpine", lambda: (j := jobs(corral, env)[job])["slurm_job_id"] and
                       j["state"] == "PENDING" and j, 60)
    assert pending["cluster"] == "alpine"  # alpine's blocker ends sooner: predicted to start there first
    why = corral("jobs", "why", job, env=env)
    assert "pending on slurm/alpine/gpu" in why.stdout and "not moved because" in why.stdout
    old_slurm_id = pending["slurm_job_id"]
    ssh_login(config, "borealis", f"scancel {blocker_b}")
    done = wait_job(corral, env, job, {"SUCCEEDED"}, timeout=90)
    assert done["cluster"] == "borealis" and done["moves"] == 1
    assert job_state(config, "alpine", old_slurm_id) == "CANCELLED"
    assert corral("jobs", "logs", "--no-follow", job, env=env).stdout.count("ran on") == 1  # ran once, on borealis
    assert "ran on borealis" in corral("jobs", "logs", "--no-follow", job, env=env).stdout
    assert any("re-routed to slurm/borealis/h100-cluster" in (e["reason"] or "") for e in events(corral, env, job))


def test_pending_job_moves_to_the_cluster_predicted_to_start_it_much_sooner(corral, env, testbed, tmp_path):
    config = testbed.cluster_config
    blocker_b = fill_h100s(config)["borealis"]
    task = tmp_path / "predicted.yaml"
    task.write_text("name: predicted\nresources:\n  accelerators: 'H100:4'\nrun: echo ran\n")
    fast = {**env, "CORRAL_CONTROLLER_PREDICT_INTERVAL": "2"}
    job = launch(corral, fast, str(task))
    pending = wait_for("the job to wait on alpine", lambda: (j := jobs(corral, fast)[job])["slurm_job_id"] and
                       j["state"] == "PENDING" and j["expected_start"] and j, 60)
    assert pending["cluster"] == "alpine"  # its blocker ends in 1 h, borealis's in 10 h
    assert 50 * 60 < pending["expected_start"] - time.time() < 61 * 60  # Slurm's own estimate, from squeue
    why = corral("jobs", "why", job, env=fast).stdout
    assert "start there: " in why and "(Slurm's estimate for this job)" in why
    assert "the alternative is not sooner" in why
    # borealis's blocker will now end within 3 minutes: 57 min sooner, beyond the 12 min margin (20 % of 1 h).
    ssh_login(config, "borealis", f"scontrol update JobId={blocker_b} TimeLimit=3")
    # Moved once the controller has recorded it: the new attempt is listed (SUBMITTING) a round trip earlier.
    moved = wait_for("the job to move to borealis", lambda: (j := jobs(corral, fast)[job])["cluster"] == "borealis"
                     and j["state"] == "PENDING" and j["moves"] >= 1 and j, 60)
    story = " | ".join(f"{e['state']}: {e['reason']}" for e in events(corral, fast, job))
    assert moved["moves"] == 1 and moved["attempts"] == 2, story
    reason = next(e["reason"] for e in events(corral, fast, job) if "re-routed" in (e["reason"] or ""))
    assert reason.startswith("re-routed to slurm/borealis/h100-cluster: predicted to start there at ")
    assert "sooner than on alpine" in reason
    wait_for("alpine's attempt to be cancelled", lambda: job_state(config, "alpine", pending["slurm_job_id"])
             == "CANCELLED")
    # Hysteresis: alpine stays an hour away, so the job stays put, tick after tick.
    for _ in range(5):
        ticks = int(corral("server", "status", "--json", env=fast).json()["ticks"])
        wait_for("another tick", lambda: int(corral("server", "status", "--json", env=fast).json()["ticks"]) > ticks)
    assert jobs(corral, fast)[job]["moves"] == 1 and jobs(corral, fast)[job]["cluster"] == "borealis"
    corral("jobs", "cancel", job, env=fast)


def test_cluster_outage_recovers_elsewhere(corral, env, testbed, tmp_path):
    task = tmp_path / "outage.yaml"
    task.write_text(COUNTER_TASK.format(name="outage", gpus="H100:1", extra="", steps=30))
    job = launch(corral, env, str(task))
    running = wait_job(corral, env, job, {"RUNNING"})
    first = running["cluster"]
    wait_for("progress", lambda: ssh_login(testbed.cluster_config, first,
                                           f"cat .corral/checkpoints/{job}/count 2>/dev/null || echo 0").strip()
             not in ("0", "1", "2"), 30)
    testbed.stop_controller(first)
    warnings: set[str] = set()

    def recovered() -> dict | None:
        warnings.update(line for line in corral("queue", env=env).stderr.splitlines() if first in line)
        j = jobs(corral, env)[job]
        return j["cluster"] != first and j["state"] in ("RUNNING", "SUCCEEDED") and j  # its few steps may be done

    try:
        moved = wait_for("recovery on another cluster", recovered, timeout=90, interval=1)
        assert moved["attempts"] == 2
        # Meanwhile a `queue` named the cluster whose squeue had not answered in 3 s, and did not wait for
        # the rest of it (Slurm's retries against the stopped controller: 8 s a refresh).
        assert any("no answer in" in line and "shown as last seen" in line for line in warnings), warnings
        # After that first failure, each refresh asked `scontrol ping` first, which said DOWN at once.
        assert any("scontrol ping: " in line and " is DOWN" in line for line in warnings), warnings
        logs = wait_for("attempt 2 output", lambda: (out := corral("jobs", "logs", "--no-follow", job, env=env).stdout)
                        and "attempt 2 starts at" in out and out, 60)
        assert int(logs.split("attempt 2 starts at ")[1].split()[0]) >= 3  # checkpoint copied across clusters
    finally:
        testbed.start_controller(first)
    # Once the first cluster answers again, its abandoned attempt is cancelled.
    old = running["slurm_job_id"]
    wait_for("the abandoned attempt to be cancelled",
             lambda: job_state(testbed.cluster_config, first, old) in ("CANCELLED", "COMPLETED", "FAILED"), 60)
    assert wait_job(corral, env, job, {"SUCCEEDED"}, timeout=90)["attempts"] == 2


def test_kill_9_the_controller_during_a_sweep(corral, env, testbed):
    tag = uuid.uuid4().hex[:8]
    out_dir = f"sweep-{tag}"
    ssh_login(testbed.cluster_config, "alpine", f"mkdir -p {out_dir}")
    n = 200
    result = corral("jobs", "launch", "--json", "--num-jobs", str(n), "--cpus", "1", "--infra", "slurm/alpine",
                    "--", f'echo "$CORRAL_TASK_ID $CORRAL_ATTEMPT" >> ~/{out_dir}/ran', env=env)
    assert result.exit_code == 0, result.stderr
    ids = result.json()["job_ids"]
    wait_for("the controller to start submitting",
             lambda: any(j["slurm_job_id"] for j in jobs(corral, env).values()), 30, interval=0.1)
    pid = int(open(os.path.join(env["CORRAL_HOME"], "controller.pid")).read())
    os.kill(pid, signal.SIGKILL)
    restarted = corral("server", "start", env=env)
    assert restarted.exit_code == 0, restarted.stderr
    # The dead server's leases are released at once (it was this home's), not after the 30 s lease.
    new_pid = int(open(os.path.join(env["CORRAL_HOME"], "controller.pid")).read())
    wait_for("the new server to hold every cluster", lambda: (status := corral("server", "status", "--json",
                                                                               env=env).json())
             and set(status["shards"]["clusters"].values()) == {status["holder"]}
             and len(status["shards"]["clusters"]) >= 3 and status["pid"] == new_pid, timeout=10, interval=0.2)
    wait_for("all jobs to succeed", lambda: all_succeeded(corral, env, ids),
             timeout=240, interval=2)
    ran = ssh_login(testbed.cluster_config, "alpine", f"cat {out_dir}/ran").split("\n")
    runs = [line.split()[0] for line in ran if line.strip()]
    assert sorted(runs) == sorted(ids)  # every job exactly once
    ssh_login(testbed.cluster_config, "alpine", f"rm -rf {out_dir}")


def test_two_controllers_never_drive_the_same_cluster(env, monkeypatch):
    import asyncio

    from corral.client import Client
    from corral.controller.engine import Controller
    from corral.state import open_store

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    store = open_store()
    everything = set(Client().registry.names())
    first = Controller(Client(), store, "first")
    second = Controller(Client(), store, "second")
    report = asyncio.run(first.tick())
    assert report.drove and report.chores and set(report.clusters) == everything  # alone: all of it
    report = asyncio.run(second.tick())
    assert not report.drove and report.clusters == []  # everything is held by the first
    ones, twos = asyncio.run(first.tick()), asyncio.run(second.tick())  # the first gives up what is beyond its share
    assert set(ones.clusters) | set(twos.clusters) == everything and not set(ones.clusters) & set(twos.clusters)
    assert ones.chores and not twos.chores  # the chores: one replica only
    first.shards.release_all()
    store.release_lease("controller", "first")
    report = asyncio.run(second.tick())
    assert report.chores and set(report.clusters) == everything


def test_churn_never_runs_a_job_twice(corral, env, testbed):
    """100 managed jobs while other users' jobs take and free GPUs on all three clusters."""
    import random
    import threading
    import time

    env = {**env, "CORRAL_CONTROLLER_REROUTE_COOLDOWN": "10"}
    config = testbed.cluster_config
    out = f"churn-{uuid.uuid4().hex[:8]}"
    ssh_login(config, "alpine", f"mkdir -p {out}")
    # `&&`: "end" means the work was done. A cancel can reach `sleep` before the bash that runs it
    # (proctrack/linuxproc signals one process at a time), and bash then runs the next command: with
    # `;`, a task killed 0.3 s in still wrote "end", which is not a second run of the work.
    script = (f'echo "start $CORRAL_TASK_ID $CORRAL_ATTEMPT" >> ~/{out}/log; sleep 3 && '
              f'echo "end $CORRAL_TASK_ID $CORRAL_ATTEMPT" >> ~/{out}/log')
    result = corral("jobs", "launch", "--json", "--num-jobs", "100", "--gpus", "gpu:2", "--", script, env=env)
    assert result.exit_code == 0, result.stderr
    ids = result.json()["job_ids"]
    fillers = [(spec.name, part.name, len(part.nodes), spec.node(part.nodes[0]))
               for spec in testbed.clusters for part in spec.partitions
               if part.nodes and spec.node(part.nodes[0]).gpus]
    stop = threading.Event()
    rng = random.Random(7)

    def churn() -> None:  # bounded: ends with the test, at most 150 s
        deadline = time.monotonic() + 150
        while not stop.is_set() and time.monotonic() < deadline:
            cluster, partition, nodes, node = rng.choice(fillers)
            gres = f"gpu:{node.gpu_type}:{node.gpus}" if node.gpu_type else f"gpu:{node.gpus}"
            if rng.random() < 0.6:
                subprocess.run(["ssh", "-F", str(config), cluster,
                                f"sbatch -J filler -p {partition} -N{nodes} --gres={gres} -t 1 --wrap 'sleep 20'"],
                               capture_output=True)
            else:
                subprocess.run(["ssh", "-F", str(config), cluster, "scancel -n filler"], capture_output=True)
            stop.wait(2)

    churner = threading.Thread(target=churn, daemon=True)
    churner.start()
    try:
        wait_for("every job to succeed", lambda: all_succeeded(corral, env, ids),
                 timeout=420, interval=3)
    finally:
        stop.set()
        churner.join(timeout=10)
    log = ssh_login(config, "alpine", f"cat {out}/log").split("\n")
    ends = [line.split()[1] for line in log if line.startswith("end ")]
    twice = sorted({i for i in ends if ends.count(i) > 1} | (set(ids) - set(ends)))
    for job_id in twice:  # what happened, for whoever reads a failure
        print(job_id, [line for line in log if job_id in line], json.dumps(events(corral, env, job_id), indent=1))
    assert sorted(ends) == sorted(ids)  # every job completed exactly once: zero double runs
    ssh_login(config, "alpine", f"rm -rf {out}")


def test_a_relative_workdir_is_read_from_where_the_user_ran_the_command(corral, env, tmp_path):
    """The controller runs elsewhere (here: started from another directory first); the managed job still
    gets the files from the directory `jobs launch` ran in."""
    assert corral("server", "start", env=env).exit_code == 0  # from the tests' own working directory
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('from the user workdir')\n")
    (tmp_path / "task.yaml").write_text("workdir: code\nrun: cat train.py\n")
    result = corral("jobs", "launch", "-d", "--json", "task.yaml", env=env, cwd=tmp_path)
    assert result.exit_code == 0, result.stderr
    job = result.json()["job_id"]
    wait_job(corral, env, job, {"SUCCEEDED"})
    assert "from the user workdir" in corral("jobs", "logs", "--no-follow", job, env=env).stdout


def test_a_step_that_does_not_start_within_the_bound_is_reported_and_recovered(corral, env, testbed, tmp_path):
    """b2's slurmd hangs while slurmctld still counts it up: the 2-node job is allocated b1 and b2, its
    batch script runs on b1, and srun's step starts on b1 only. The step-start bound (4 s here) ends the
    job and says why in its comment; the controller recovers the managed job once b2 answers again."""
    env = {**env, "CORRAL_STEP_START_BOUND": "4"}
    corral("server", "stop", env=env)  # the bound is read by the engine: start one with it
    task = tmp_path / "two-nodes.yaml"
    task.write_text("resources: {infra: slurm/borealis/h100-cluster, accelerators: 'H100:1'}\nnum_nodes: 2\n"
                    "run: echo rank $CORRAL_NODE_RANK ran\n")
    testbed.freeze_node("b2")
    try:
        job = launch(corral, env, str(task))
        wait_for("the first attempt to fail", lambda: any(
            e["state"] == "RECOVERING" for e in events(corral, env, job)), timeout=60)
    finally:
        testbed.thaw_node("b2")
        testbed.resume("b2")  # slurmctld set it down when the step launch failed; back at once, not at its next ping
    done = wait_job(corral, env, job, {"SUCCEEDED"}, timeout=120)
    assert done["attempts"] == 2
    story = " | ".join(f"{e['state']}: {e['reason']}" for e in events(corral, env, job))
    assert "the srun step started on 1 of 2 node(s) within 4 s of the batch script" in story, story
    corral("server", "stop", env=env)


PIPELINE = """\
name: {name}
---
name: train
resources:
  infra: slurm/cirrus/debug
run: |
  echo train
  echo model-ok > ~/$CORRAL_PIPELINE_ID.out
---
name: eval
workdir: eval-code
resources:
  infra: slurm/cirrus/debug
run: |
  echo "eval reads $(cat ~/$CORRAL_PIPELINE_ID.out) with $(cat check.sh)"
  {eval_end}
---
name: report
resources:
  infra: slurm/cirrus/debug
run: echo "report, task $CORRAL_PIPELINE_TASK of $CORRAL_PIPELINE_NAME"
"""


def test_a_pipeline_runs_its_tasks_one_after_another_and_stops_at_the_first_failure(corral, env, tmp_path):
    """SkyPilot's pipeline file, unchanged: each task starts once the one before it succeeded (and reads
    what it left on the cluster), each with its own workdir; a task that fails skips the rest."""
    name = f"pipe-{uuid.uuid4().hex[:8]}"
    (tmp_path / "eval-code").mkdir()
    (tmp_path / "eval-code" / "check.sh").write_text("the eval workdir\n")
    (tmp_path / "pipe.yaml").write_text(PIPELINE.format(name=name, eval_end="true"))
    attached = corral("jobs", "launch", "pipe.yaml", env=env, cwd=tmp_path)
    assert attached.exit_code == 0, attached.stderr
    # the tasks share their pipeline's id (one run's: a folder of their own), and know their place in it
    assert attached.stdout == f"train\neval reads model-ok with the eval workdir\nreport, task 2 of {name}\n"
    tasks = [j for j in jobs(corral, env).values() if (j.get("pipeline") or {}).get("name") == name]
    tasks.sort(key=lambda j: j["pipeline"]["task"])
    assert [(j["name"], j["state"], j["attempts"]) for j in tasks] == [
        ("train", "SUCCEEDED", 1), ("eval", "SUCCEEDED", 1), ("report", "SUCCEEDED", 1)]
    assert {j["pipeline"]["id"] for j in tasks} == {tasks[0]["job_id"]}
    # Slurm's end times are whole seconds: a task launched at .6 and ended within that second ends at .0
    assert all(j["run_seconds"] is not None and j["ended_at"] > j["created_at"] - 1 for j in tasks), tasks
    assert f"=== pipeline {name}, task 1: {tasks[1]['job_id']} ===" in attached.stderr
    waited = [e["reason"] for e in events(corral, env, tasks[1]["job_id"])]
    assert f"waiting for the pipeline's task 0 ({tasks[0]['job_id']}) to succeed" in waited
    # Each task was submitted after the one before it ended, as Slurm saw it end.
    from corral.sdk import Client

    attempts = [Client().managed_job(j["job_id"])["attempt_list"][0] for j in tasks]
    assert attempts[0]["ended_at"] <= attempts[1]["submitted_at"]
    assert attempts[1]["ended_at"] <= attempts[2]["submitted_at"]
    followed = corral("jobs", "logs", name, env=env)  # the pipeline's name: its tasks, one after another
    assert (followed.exit_code, followed.stdout) == (0, attached.stdout), followed.stderr

    (tmp_path / "pipe.yaml").write_text(PIPELINE.format(name=name + "-f", eval_end="exit 3"))
    failed = corral("jobs", "launch", "pipe.yaml", env=env, cwd=tmp_path)
    assert failed.exit_code == 3, failed.stderr
    assert failed.stdout == "train\neval reads model-ok with the eval workdir\n"
    assert f"pipeline {name}-f stopped at task 1: the tasks after it are skipped" in failed.stderr
    [report] = [j for j in jobs(corral, env).values()
                if (j.get("pipeline") or {}).get("name") == name + "-f" and j["name"] == "report"]
    assert (report["state"], report["attempts"], report["run_seconds"]) == ("CANCELLED", 0, None)
    assert report["ended_at"] >= report["created_at"]  # it ended when it was skipped
    assert report["reason"].startswith("skipped: the pipeline's task 1 (") and report["reason"].endswith("ended FAILED")

    single = corral("launch", "pipe.yaml", env=env, cwd=tmp_path)  # not a managed job: says where it runs
    assert single.exit_code == 65
    assert "holds 4 YAML documents, a pipeline (or a job group) of tasks: launch it as a managed job, " \
           "`corral jobs launch pipe.yaml`" in single.stderr


JOB_GROUP = """\
name: {name}
execution: parallel
primary_tasks: [trainer]
termination_delay: 2s
---
name: data-server
run: |
  echo "data-server up in $SKYPILOT_JOBGROUP_NAME as $CORRAL_JOBGROUP_TASK"
  trap 'echo "data-server stopping"; exit 0' TERM
  while true; do sleep 1; done
---
name: trainer
run: |
  for i in $(seq 60); do [ -s "$CORRAL_JOBGROUP_HOSTS/data-server-0" ] && break; sleep 1; done
  echo "trainer reaches data-server on $(cat "$CORRAL_JOBGROUP_HOSTS/data-server-0")"
  {trainer_end}
"""


def test_a_job_group_runs_its_tasks_side_by_side_and_stops_the_auxiliary_one_after_the_primary(corral, env,
                                                                                              tmp_path):
    """SkyPilot's job group file, unchanged: its tasks run at once on one cluster, the trainer finds the
    data server's node through CORRAL_JOBGROUP_HOSTS, and the data server (auxiliary) gets TERM once
    the trainer has ended and termination_delay has passed; the trainer's exit code is the group's."""
    from corral.sdk import Client
    from corral.sdk.types import PipelinePlace

    name = f"grp-{uuid.uuid4().hex[:8]}"
    (tmp_path / "group.yaml").write_text(JOB_GROUP.format(name=name, trainer_end="true"))
    attached = corral("jobs", "launch", "group.yaml", env=env, cwd=tmp_path)
    assert attached.exit_code == 0, attached.stderr
    lines = attached.stdout.splitlines()
    found = "trainer reaches data-server on "
    assert lines[0].startswith(found) and len(lines[0]) > len(found)  # a host name after it
    # (the log holds Slurm's own words on the cancel too: the task's output lines are these)
    assert [line for line in lines[1:] if line.startswith("data-server")] == [
        f"data-server up in {name} as data-server", "data-server stopping"]
    tasks = sorted((j for j in jobs(corral, env).values() if (j.get("pipeline") or {}).get("name") == name),
                   key=lambda j: j["pipeline"]["task"])
    server, trainer = tasks
    assert (server["state"], trainer["state"]) == ("CANCELLED", "SUCCEEDED")
    assert server["reason"] == (f"stopped: the job group's primary tasks have ended ({trainer['job_id']} SUCCEEDED), "
                                "and its termination_delay of 2s has passed")
    assert server["cluster"] == trainer["cluster"]  # one cluster, where they reach each other
    # their host files, in the folder of the group's round (the testbed's clusters share this home)
    [round_folder] = Path(f"/home/corral-test/.corral/groups/{server['job_id']}").iterdir()
    assert re.fullmatch("[0-9a-f]{12}", round_folder.name)
    assert sorted(p.name for p in round_folder.iterdir()) == ["data-server-0", "trainer-0"]
    shown = {j.job_id: j for j in Client().managed_jobs(all=True)[0]}
    assert shown[server["job_id"]].pipeline == PipelinePlace(server["job_id"], name, 0, parallel=True, auxiliary=True)
    assert shown[trainer["job_id"]].pipeline == PipelinePlace(server["job_id"], name, 1, parallel=True)
    attempts = {j["name"]: Client().managed_job(j["job_id"])["attempt_list"][0] for j in tasks}
    assert attempts["data-server"]["started_at"] <= attempts["trainer"]["ended_at"]  # side by side
    # stopped no sooner than its delay after the trainer ended (Slurm's times are whole seconds)
    assert attempts["data-server"]["ended_at"] >= attempts["trainer"]["ended_at"] + 2 - 1
    # followed from its primary task (the launch answer names the auxiliary one), then the auxiliary one
    assert attached.stderr.index(f"=== job group {name}, task 1: {trainer['job_id']} ===") \
        < attached.stderr.index(f"=== job group {name}, task 0 (auxiliary): {server['job_id']} ===")

    (tmp_path / "group.yaml").write_text(JOB_GROUP.format(name=name + "-f", trainer_end="exit 4"))
    failed = corral("jobs", "launch", "group.yaml", env=env, cwd=tmp_path)
    assert failed.exit_code == 4, failed.stderr  # the primary task's, not the stopped server's
    assert "data-server stopping" in failed.stdout.splitlines()
    followed = corral("jobs", "logs", name + "-f", env=env)  # the group's name: every task's output
    assert followed.exit_code == 4 and "data-server stopping" in followed.stdout, followed.stderr
    alone = corral("jobs", "logs", name + "-f", "trainer", env=env)  # one task by its name, as sky jobs logs JOB TASK
    assert alone.exit_code == 4 and alone.stdout.startswith("trainer reaches data-server on "), alone.stderr
    assert "data-server" not in alone.stdout.replace("reaches data-server on", "")


def test_a_pipeline_is_cancelled_by_its_name(corral, env, tmp_path):
    name = f"pipe-{uuid.uuid4().hex[:8]}"
    (tmp_path / "p.yaml").write_text("\n---\n".join(["name: ignored", "run: echo one; sleep 600", "run: echo two"]))
    result = corral("jobs", "launch", "-d", "--json", "-n", name, "p.yaml", env=env, cwd=tmp_path)
    assert result.exit_code == 0, result.stderr
    first, second = result.json()["job_ids"]
    assert result.json()["pipeline"] == name  # -n names the pipeline, as `sky jobs launch -n`
    wait_job(corral, env, first, {"RUNNING"})
    assert jobs(corral, env)[second]["state"] == "PENDING"
    from corral.sdk import Client
    from corral.sdk.types import PipelinePlace

    shown = {j.job_id: j for j in Client().managed_jobs(all=True)[0]}  # the SDK's typed answer says so too
    assert (shown[first].pipeline, shown[second].pipeline) == (PipelinePlace(first, name, 0),
                                                               PipelinePlace(first, name, 1))
    cancelled = corral("jobs", "cancel", name, env=env)
    assert (cancelled.exit_code, cancelled.stdout) == (0, f"{first}: cancelling\n{second}: cancelling\n")
    assert wait_job(corral, env, first, {"CANCELLED"})["attempts"] == 1
    assert (jobs(corral, env)[second]["state"], jobs(corral, env)[second]["attempts"]) == ("CANCELLED", 0)
