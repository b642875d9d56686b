"""`ssh/<pool>` on the real testbed: the testbed's SSH machines (lab1-lab4, each its own host with its own
sshd and a stand-in nvidia-smi) as one pool next to the three Slurm clusters. One view; work overflows
to the pool only where no Slurm cluster starts it sooner; tasks pack onto machines by free GPUs, each in
its own process group with its GPUs in CUDA_VISIBLE_DEVICES; logs, cancel, queue; a machine that goes
away fails its task as the infrastructure's doing, and a managed job is recovered elsewhere."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from corral.infra.sshpool import moves, runner
from tests.conftest import wait_for
from tests.helpers import cancel_a_running_exec, counting_ssh, launch_managed, runs_somewhere

def test_the_pool_is_in_the_one_view_at_one_round_trip_per_machine(corral, pool_env, tmp_path):
    env, calls = counting_ssh(tmp_path, pool_env)
    for attempt in ("cold", "warm"):
        before = len(calls())
        gpus = corral("gpus", "--json", env=env)
        assert gpus.exit_code == 0, gpus.stderr
        assert sorted(calls()[before:]) == ["alpine", "borealis", "cirrus", "lab1", "lab2", "lab3", "lab4"], attempt
    rows = {(r["cluster"], r["gpu"]): r for r in gpus.json() if "error" not in r}
    assert rows[("lab", "A100")]["total"] == 8 and rows[("lab", "A100")]["nodes"] == 2
    assert rows[("lab", "A100")]["gres_type"] == "NVIDIA A100-SXM4-80GB"
    assert rows[("lab", "L4")]["total"] == 2 and rows[("lab", "A10G")]["total"] == 1  # lab4's, from the config
    assert ("alpine", "H100") in rows  # side by side with the clusters
    assert rows[("lab", "A100")]["infra"] == "ssh/lab" and rows[("alpine", "H100")]["infra"] == "slurm/alpine/gpu"
    table = [line.split() for line in corral("gpus", env=pool_env).stdout.splitlines()]
    assert ["ssh/lab", "-", "A100"] == next(row for row in table if "A100" in row)[:3]  # no partition to show
    assert ["alpine", "gpu", "H100"] == next(row for row in table if "H100" in row)[:3]
    only = corral("gpus", "--json", "--infra", "ssh", env=pool_env).json()
    assert {r["cluster"] for r in only} == {"lab"}
    checked = {c["cluster"]: c for c in corral("check", "--json", env=pool_env).json()}
    assert checked["lab"]["ok"]


def test_work_overflows_to_the_pool_and_packs_onto_machines(corral, pool_env):
    # An L4 task: alpine's L4 can start it now, so Slurm first (the pool's L4s are the overflow).
    l4 = corral("launch", "-d", "--json", "--gpus", "L4:1", "--", "true", env=pool_env).json()
    assert l4["cluster"] == "alpine"
    # A100s: only the pool has them. Two tasks of two share one machine; the third takes the next.
    placed = [corral("launch", "-d", "--json", "--gpus", "A100:2", "--",
                     'echo starting; echo "$(hostname) $CUDA_VISIBLE_DEVICES $CORRAL_CLUSTER $CORRAL_TASK_ID"; '
                     'sleep 300', env=pool_env).json() for _ in range(3)]
    machines = [p["slurm_job_id"].split("/")[0] for p in placed]
    assert machines[0] == machines[1] != machines[2]
    full = [wait_for("its output", lambda p=p: (o := corral("logs", "--no-follow", p["job_id"], env=pool_env).stdout)
                     .count("\n") == 2 and o) for p in placed]
    outputs = [corral("logs", "--no-follow", "--tail", "1", p["job_id"], env=pool_env).stdout for p in placed]
    assert [f"starting\n{o}" for o in outputs] == full  # --tail 1: the last line only
    lines = [o.split() for o in outputs]
    assert {lines[0][1], lines[1][1]} == {"0,1", "2,3"} and lines[2][1] == "0,1"  # its own GPUs each
    assert all(line[2] == "lab" and line[3] == p["job_id"] for line, p in zip(lines, placed))
    queue = {j["job_id"]: j for j in corral("queue", "--json", env=pool_env).json()}
    assert all(queue[p["job_id"]]["state"] == "RUNNING" and queue[p["job_id"]]["infra"] == "ssh/lab" for p in placed)
    header, *rows = corral("queue", env=pool_env).stdout.splitlines()
    assert "INFRA ID" in header and "SLURM ID" not in header  # a pool's handle is no Slurm job id
    assert any(row.split()[2:4] == ["ssh/lab", placed[0]["slurm_job_id"]] for row in rows), rows
    # Cancel ends the task's whole process group, and its GPUs are free again.
    assert "cancelled" in corral("cancel", placed[0]["job_id"], env=pool_env).stdout
    host, token = placed[0]["slurm_job_id"].split("/")
    wait_for("the task's processes to end", lambda: subprocess.run(
        ["pgrep", "-f", f"corral/runs/{token}/"], capture_output=True).returncode != 0, timeout=20)
    free = {r["gpu"]: r["free"] for r in corral("gpus", "--json", "--infra", "ssh/lab", env=pool_env).json()}
    assert free["A100"] == 4


def test_a_machine_that_goes_away_fails_its_task_and_a_managed_job_recovers(corral, pool_env, machines, tmp_path):
    env = {**pool_env, "CORRAL_CONTROLLER_INTERVAL": "1", "CORRAL_CONTROLLER_GRACE_SECONDS": "6"}
    job_id, managed = launch_managed(corral, env, tmp_path / "survivor.yaml", {
        "name": "survivor", "resources": {"accelerators": "A100:4"}, "run": 'echo "on $(hostname)"; sleep 600'})

    first = wait_for("the job to run on a machine", lambda: (j := managed())["state"] == "RUNNING" and j, 60)
    host = first["slurm_job_id"].split("/")[0]
    machines.stop_machine(host)
    try:
        moved = wait_for("the job to be recovered on another machine", lambda: (j := managed())["state"] == "RUNNING"
                         and (j["slurm_job_id"] or "").split("/")[0] not in (host, "") and j, 120)
        events = corral("jobs", "events", job_id, "--json", env=env).json()
        assert any("MACHINE_DOWN" in (e.get("reason") or "") and "has not answered" in e["reason"] for e in events), events
        assert any(f"submitted to ssh/lab as {moved['slurm_job_id']}" in (e.get("reason") or "") for e in events), events
        assert moved["recoveries"] >= 1
        assert moved["infra"] == "ssh/lab"  # as `queue` writes it; the table shows it so too
        header, *rows = corral("jobs", "queue", env=env).stdout.splitlines()
        row = next(line for line in rows if job_id in line)
        assert row.split()[3:5] == ["ssh/lab", moved["slurm_job_id"]] and "INFRA ID" in header, (header, row)
    finally:
        machines.start_machine(host)
        corral("jobs", "cancel", job_id, env=env)


def test_a_task_declared_failed_on_a_machine_cut_off_is_ended_there_once_it_answers_again(corral, pool_env, machines):
    """A partition, not a crash: the machine runs on. Before, its rank ran on for good once it answered
    again, holding its claim (a 2-node task's, found as a task that ended on its other rank; a 1-node
    task's, found running under a failed attempt), as slurmd ends a job it no longer knows."""
    env = {**pool_env, "CORRAL_CONTROLLER_INTERVAL": "1"}
    (Path(env["CORRAL_HOME"]) / "config.yaml").write_text(json.dumps(
        {"pools": {"pair": {"hosts": ["lab1", "lab2"]}, "solo": {"hosts": ["lab3"]}}}))
    pair = corral("launch", "-d", "--json", "--infra", "ssh/pair", "--num-nodes", "2", "--", "sleep 6001", env=env)
    solo = corral("launch", "-d", "--json", "--infra", "ssh/solo", "--", "sleep 6002", env=env)
    assert pair.exit_code == 0 and solo.exit_code == 0, pair.stderr + solo.stderr
    ids = {pair.json()["job_id"]: "sleep 6001", solo.json()["job_id"]: "sleep 6002"}

    def states() -> dict[str, tuple[str, str]]:
        return {j["job_id"]: (j["state"], j["reason"] or "") for j in corral("queue", "--json", env=env).json()
                if j["job_id"] in ids}

    def running(command: str) -> bool:
        return subprocess.run(["pgrep", "-u", "corral-test", "-fx", command], capture_output=True).returncode == 0

    wait_for("both tasks to run", lambda: {s for s, _ in states().values()} == {"RUNNING"}
             and all(running(c) for c in ids.values()), 60)
    machines.unplug_machine("lab2")
    machines.unplug_machine("lab3")
    try:
        failed = wait_for("both to be declared failed", lambda: (now := states()) and all(
            state == "FAILED" and "MACHINE_DOWN" in reason for state, reason in now.values()) and now, 150)
        assert "lab2 has not answered" in failed[pair.json()["job_id"]][1], failed
        assert running("sleep 6001") and running("sleep 6002")  # cut off, not crashed: they ran on
    finally:
        machines.plug_machine("lab2")
        machines.plug_machine("lab3")
    wait_for("the tasks to be ended on the machines that answer again",
             lambda: not running("sleep 6001") and not running("sleep 6002"), 60)
    assert {s for s, _ in states().values()} == {"FAILED"}


def test_a_multi_node_task_spans_machines_whose_ranks_reach_each_other(corral, pool_env):
    run = ('head=$(echo $CORRAL_NODE_IPS | cut -d" " -f1)\n'
           'echo "rank=$CORRAL_NODE_RANK host=$(hostname) n=$CORRAL_NUM_NODES ips=$(echo $CORRAL_NODE_IPS | tr " " ,) '
           'gpus=$CUDA_VISIBLE_DEVICES"\n'
           'if [ "$CORRAL_NODE_RANK" = 0 ]; then echo "hello from rank 0" > msg; exec python3 -m http.server 18777 '
           '--bind "$head" >/dev/null 2>&1; fi\n'
           # rank 0's python starts slowly on a loaded host: rank 1 retries for up to 60 s
           'for i in $(seq 300); do curl -sf "http://$head:18777/msg" && break; sleep 0.2; done\n'
           "sleep 300\n")
    placed = corral("launch", "-d", "--json", "--gpus", "A100:4", "--num-nodes", "2", "--", run, env=pool_env)
    assert placed.exit_code == 0, placed.stderr
    job = placed.json()
    hosts, token = job["slurm_job_id"].split("/")
    assert job["cluster"] == "lab" and sorted(hosts.split(",")) == ["lab1", "lab2"]
    head, other = hosts.split(",")
    addresses = {"lab1": "10.201.0.11", "lab2": "10.201.0.12"}
    # `logs` shows every rank's output, rank 0's first, as a Slurm job's log holds every node's
    shown = wait_for("rank 1 to reach rank 0", lambda: "hello from rank 0" in (o := corral(
        "logs", "--no-follow", job["job_id"], env=pool_env).stdout) and o, timeout=90)
    ips = f"{addresses[head]},{addresses[other]}"
    assert shown.splitlines() == [f"0: rank=0 host={head} n=2 ips={ips} gpus=0,1,2,3",  # each after its rank
                                  f"1: rank=1 host={other} n=2 ips={ips} gpus=0,1,2,3", "1: hello from rank 0"]
    last = corral("logs", "--no-follow", "--tail", "1", job["job_id"], env=pool_env).stdout
    assert last.splitlines() == [shown.splitlines()[0], "1: hello from rank 0"]  # each rank's last line
    queued = {j["job_id"]: j for j in corral("queue", "--json", env=pool_env).json()}[job["job_id"]]
    assert (queued["state"], queued["infra"]) == ("RUNNING", "ssh/lab")
    assert "cancelled" in corral("cancel", job["job_id"], env=pool_env).stdout
    wait_for("both ranks to end", lambda: subprocess.run(["pgrep", "-f", f"corral/runs/{token}"],
                                                         capture_output=True).returncode != 0, timeout=20)
    # One rank fails: the task fails with it, and the other rank is ended (as srun's --kill-on-bad-exit).
    failing = corral("launch", "-d", "--json", "--gpus", "A100:4", "--num-nodes", "2", "--",
                     '[ "$CORRAL_NODE_RANK" = 1 ] && { sleep 2; exit 7; }; sleep 300', env=pool_env).json()
    ended = wait_for("the task to fail", lambda: (j := {q["job_id"]: q for q in corral(
        "queue", "--json", env=pool_env).json()}[failing["job_id"]])["state"] == "FAILED" and j, 30)
    assert (ended["exit_code"], ended["reason"]) == (7, "rank 1: FAILED (exit code 7)")
    failed_token = failing["slurm_job_id"].split("/")[1]
    wait_for("rank 0 to be ended too", lambda: subprocess.run(["pgrep", "-f", f"corral/runs/{failed_token}"],
                                                              capture_output=True).returncode != 0, timeout=30)


def test_dev_allocations_hold_a_pool_machine_s_gpus(corral, pool_env, tmp_path):
    up = corral("launch", "-c", "labdev", "--infra", "ssh/lab", "--gpus", "A100:2", "--json", env=pool_env)
    assert up.exit_code == 0, up.stderr
    info = up.json()
    assert info["cluster"] == "lab" and info["new"] and len(info["nodes"]) == 1
    host = info["nodes"][0]
    result = corral("exec", "labdev", "--",
                    'echo "$(hostname) $CUDA_VISIBLE_DEVICES $CORRAL_CLUSTER $CORRAL_NODE_RANK $CORRAL_TASK_ID"',
                    env=pool_env)
    assert result.exit_code == 0, result.stderr
    words = result.stdout.split()
    assert words[:4] == [host, "0,1", "lab", "0"] and words[4].startswith("c-")
    assert corral("exec", "labdev", "--", "exit 4", env=pool_env).exit_code == 4
    loud = corral("exec", "labdev", "--", "echo out; echo err >&2", env=pool_env)
    assert (loud.exit_code, loud.stdout) == (0, "out\nerr\n"), loud.stderr  # stderr too, as in a job's log
    [last] = corral("queue", "labdev", "--json", "--limit", "1", env=pool_env).json()
    kept = corral("logs", last["job_id"], env=pool_env)
    assert (kept.exit_code, kept.stdout) == (0, "out\nerr\n"), kept.stderr
    # `launch -c` on it again runs the task's setup again first, as `sky launch` on a live cluster does.
    task = tmp_path / "again.yaml"
    task.write_text("resources:\n  infra: ssh/lab\n  accelerators: A100:2\nsetup: echo setup $CORRAL_NODE_RANK\n"
                    "run: echo run $CORRAL_NODE_RANK\n")
    again = corral("launch", "-c", "labdev", str(task), env=pool_env)
    assert (again.exit_code, again.stdout) == (0, "setup 0\nrun 0\n"), again.stderr
    cancel_a_running_exec(corral, pool_env, "labdev")
    assert corral("exec", "labdev", "--", "true", env=pool_env).exit_code == 0  # the allocation lives on
    shell = corral("ssh", "labdev", "--", 'echo "$(hostname) $CUDA_VISIBLE_DEVICES $(basename $(dirname $PWD))"',
                   env=pool_env)
    assert shell.exit_code == 0, shell.stderr
    assert shell.stdout.split()[:2] == [host, "0,1"]
    status = next(s for s in corral("status", "--json", env=pool_env).json() if s["name"] == "labdev")
    assert status["state"] == "READY" and status["nodes"] == [host] and status["infra"] == "ssh/lab"
    assert (status["gres"], status["accelerators"]) == ("gpu:NVIDIA A100-SXM4-80GB:2", "A100:2")
    row = next(line for line in corral("status", env=pool_env).stdout.splitlines() if "labdev" in line)
    assert row.split()[1:4] == ["ssh/lab", "1x", "A100:2"], row
    free = {r["gpu"]: r["free"] for r in corral("gpus", "--json", "--infra", "ssh/lab", env=pool_env).json()}
    assert free["A100"] == 6  # its two held while it lives
    assert corral("down", "labdev", env=pool_env).exit_code == 0
    free = {r["gpu"]: r["free"] for r in corral("gpus", "--json", "--infra", "ssh/lab", env=pool_env).json()}
    assert free["A100"] == 8
    # Two machines: exec runs on both, each as its rank, with both addresses.
    pair = corral("launch", "-c", "pair", "--infra", "ssh/lab", "--gpus", "A100:4", "--num-nodes", "2", "--json",
                  env=pool_env)
    assert pair.exit_code == 0, pair.stderr
    assert sorted(pair.json()["nodes"]) == ["lab1", "lab2"]
    ranks = corral("exec", "pair", "--", 'echo "$CORRAL_NODE_RANK $(hostname) $(echo $CORRAL_NODE_IPS | tr " " ,)"',
                   env=pool_env)
    assert ranks.exit_code == 0, ranks.stderr
    head, other = pair.json()["nodes"]
    ips = {"lab1": "10.201.0.11", "lab2": "10.201.0.12"}
    both = f"{ips[head]},{ips[other]}"
    assert sorted(ranks.stdout.splitlines()) == [f"0: 0 {head} {both}", f"1: 1 {other} {both}"]
    # Execs naming GPUs take their own on every machine (they all saw all four), claimed one machine
    # at a time in rank order (two could otherwise each hold a machine the other waits for).
    hold = 'echo "$CORRAL_TASK_ID cvd=$CUDA_VISIBLE_DEVICES n=$CORRAL_NUM_GPUS_PER_NODE"; ' \
           'until [ -e ~/go-pair ]; do sleep 0.1; done'
    first, second, third = (corral("exec", "pair", "-d", "--gpus", "A100:2", "--", command, env=pool_env).stdout.strip()
                            for command in (hold, hold, "echo third cvd=$CUDA_VISIBLE_DEVICES"))

    def output(job_id: str) -> str:
        return corral("logs", job_id, "--no-follow", env=pool_env).stdout

    # `logs` of an exec shows every machine's output, as `corral exec` does: a line from each
    shown = wait_for("both to print their GPUs on both machines", lambda: all(
        len(output(job).splitlines()) == 2 for job in (first, second)) and {job: output(job) for job in (first, second)},
        timeout=60)
    gpus = {job: {line.split()[2] for line in text.splitlines()} for job, text in shown.items()}
    assert sorted(g for held in gpus.values() for g in held) == ["cvd=0,1", "cvd=2,3"], shown  # the same on both
    assert all(sorted(line.split()[0] for line in text.splitlines()) == ["0:", "1:"] for text in shown.values())
    assert all(line.split()[1] == job and line.endswith(" n=2") for job, text in shown.items()
               for line in text.splitlines()), shown
    waiting = "corral: waiting for 2 of the allocation's 4 GPUs per node, in use by job(s) "
    wait_for("the third to wait", lambda: output(third).startswith("0: " + waiting), timeout=60)
    assert sorted(output(third).splitlines()[0].split("job(s) ")[1].split()) == sorted([first, second])
    assert corral("exec", "pair", "--", "touch ~/go-pair", env=pool_env).exit_code == 0  # takes no GPUs: runs
    done = corral("logs", third, env=pool_env)
    assert done.exit_code == 0 and "\n0: corral: its GPUs are free after " in done.stdout, done.stdout
    ran = sorted(line for line in done.stdout.splitlines() if line[3:].startswith("third "))
    assert [line[:3] for line in ran] == ["0: ", "1: "] and ran[0][3:] == ran[1][3:], done.stdout
    assert re.fullmatch(r"third cvd=(0,1|2,3)", ran[0][3:]), done.stdout
    assert corral("exec", "pair", "--", "rm -f ~/go-pair", env=pool_env).exit_code == 0
    assert corral("down", "pair", env=pool_env).exit_code == 0
    # An allocation nothing runs in is released by its holder on the machine, without a server, once
    # idle for the limit `corral autostop` gave it (it had none).
    idle = corral("launch", "-c", "idler", "--infra", "ssh/lab", "--gpus", "L4:1", "--json", env=pool_env)
    assert idle.exit_code == 0, idle.stderr
    soon = corral("autostop", "idler", "-i", "0.1", env=pool_env)
    assert (soon.exit_code, soon.stdout) == (0, "idler: released once idle for 0.1 min\n"), soon.stderr
    ended = wait_for("the idle allocation to be released", lambda: (s := next(
        s for s in corral("status", "--json", env=pool_env).json() if s["name"] == "idler"))["state"] == "ENDED" and s,
        timeout=40)
    assert ended["reason"] == "released after being idle"
    corral("down", "idler", env=pool_env)
    # A setup that fails: its output was shown as it ran, and status keeps its last lines (it gave only
    # its exit code).
    broken = tmp_path / "broken.yaml"
    broken.write_text("resources:\n  infra: ssh/lab\n  accelerators: L4:1\nsetup: |\n  echo installing\n  exit 4\n")
    failed = corral("launch", "-c", "broken", str(broken), env=pool_env)
    assert failed.exit_code == 1 and failed.stdout.startswith("installing\n"), (failed.stdout, failed.stderr)
    assert "is FAILED: setup failed with exit code 4; its output is above" in failed.stderr, failed.stderr
    kept = next(s for s in corral("status", "--json", env=pool_env).json() if s["name"] == "broken")
    assert kept["setup_output"].startswith("installing\ncorral: setup failed on "), kept
    assert corral("down", "broken", env=pool_env).exit_code == 0


def test_a_machine_that_refuses_a_task_keeps_none_of_its_files(pool_env, monkeypatch):
    """A machine that refuses a task (its GPUs taken since the probe) removes the run directory it was
    given, env.sh and its secrets included; when it refuses one rank of a multi-node task, the ranks
    started on other machines are ended and their env.sh removed at once (no handle names them for
    the later pass over ended jobs)."""
    import asyncio

    from corral.client import Client
    from corral.infra.base import JobRequest, new_token
    from corral.infra.sshpool import runner

    monkeypatch.setenv("CORRAL_SLURM_CONFIG", pool_env["CORRAL_SLURM_CONFIG"])
    runs = Path("/home/corral-test/.corral/runs")  # the machines share this host's disk

    def request(nodes: int, run: str) -> JobRequest:
        return JobRequest(token=new_token(), task_ids=("c-000000000001",), place="lab", num_nodes=nodes,
                          accelerator_type=None, accelerators_per_node=4, cpus_per_node=None, memory_mb=None,
                          envs={"TOKEN": "s3cret-value"}, setup=None, run=run)

    async def scenario() -> tuple:
        pool = Client().infra("lab")
        await pool.probe()
        wanted = request(2, "sleep 300")
        first, second = pool._order(wanted)[:2]  # the machines that can start it now, in order
        holder = request(1, "sleep 300")  # takes the second machine's GPUs after the probe saw them free
        files = {"job.sh": runner.job_script(holder, "lab"), "env.sh": "", "setup.sh": "", "run.sh": "sleep 300"}
        taken = await pool.transport.run(second, runner.submit_script(holder, "lab", files), timeout=30)
        refused_one = request(1, "true")
        files = {"job.sh": runner.job_script(refused_one, "lab"), "env.sh": "export TOKEN=s3cret-value\n",
                 "setup.sh": "", "run.sh": "true"}
        refused = await pool.transport.run(second, runner.submit_script(refused_one, "lab", files), timeout=30)
        answer = await pool.submit(wanted)
        await pool.cancel([f"{second}/{holder.token}"], [""])
        return first, second, taken.stdout, refused.stdout, refused_one.token, answer, wanted.token

    first, second, taken, refused, refused_token, answer, token = asyncio.run(scenario())
    assert f"@@corral submitted {second}/" in taken
    assert f"@@corral rejected {second} has 0 free GPU(s)" in refused and not (runs / refused_token).exists()
    assert not answer.accepted and f"rank 1 could not start on {second}" in answer.message, answer.message
    assert not (runs / f"{token}.1").exists()  # refused: removed whole
    assert (runs / f"{token}.0").is_dir() and not (runs / f"{token}.0" / "env.sh").exists()  # started, then ended
    wait_for("rank 0 to be ended", lambda: subprocess.run(["pgrep", "-f", f"corral/runs/{token}"],
                                                          capture_output=True).returncode != 0, timeout=30)


def test_a_rank_whose_answer_was_lost_is_ended_with_the_ranks_before_it(pool_env, monkeypatch):
    """Rank 1's machine started it, and its answer was lost on the way back: the task is refused, as
    before, and rank 1 is now ended too (it used to keep its GPUs until its run ended, no handle naming
    it), its env.sh removed."""
    import asyncio

    from corral.client import Client
    from corral.errors import ClusterError
    from corral.infra.base import JobRequest, new_token

    monkeypatch.setenv("CORRAL_SLURM_CONFIG", pool_env["CORRAL_SLURM_CONFIG"])
    runs = Path("/home/corral-test/.corral/runs")  # the machines share this host's disk
    wanted = JobRequest(token=new_token(), task_ids=("c-000000000001",), place="lab", num_nodes=2,
                        accelerator_type=None, accelerators_per_node=4, cpus_per_node=None, memory_mb=None,
                        envs={"TOKEN": "s3cret-value"}, setup=None, run="sleep 3061")

    async def scenario() -> tuple:
        pool = Client().infra("lab")
        await pool.probe()
        second = pool._order(wanted)[1]
        submissions = pool._submissions(second)
        sent = submissions.submit

        async def lost(script, workdir):
            await sent(script, workdir)
            raise ClusterError(second, "no answer (the answer was lost)")
        submissions.submit = lost
        return second, await pool.submit(wanted)

    second, answer = asyncio.run(scenario())
    assert not answer.accepted and f"rank 1 could not start on {second} (" in answer.message, answer.message
    assert (runs / f"{wanted.token}.1").is_dir() and not (runs / f"{wanted.token}.1" / "env.sh").exists()
    wait_for("both ranks to be ended", lambda: not runs_somewhere("sleep", "3061"), timeout=30)


def test_exec_syncs_the_workdir_into_a_pool_allocation(corral, pool_env, tmp_path):
    """As `sky exec` syncs the workdir before it runs: the files reach the allocation's machine, and a
    second exec sees the changed file."""
    up = corral("launch", "-c", "labwork", "--infra", "ssh/lab", "--gpus", "L4:1", env=pool_env)
    assert up.exit_code == 0 and "labwork is ready on ssh/lab (nodes: " in up.stderr, up.stderr
    work = tmp_path / "work"
    work.mkdir()
    (work / "note.txt").write_text("v1\n")
    task = tmp_path / "task.yaml"
    task.write_text(f"workdir: {work}\nrun: cat note.txt\n")
    try:
        first = corral("exec", "labwork", str(task), env=pool_env)
        assert (first.exit_code, first.stdout) == (0, "v1\n"), first.stderr
        (work / "note.txt").write_text("v2, longer\n")  # rsync's quick check: another size within the second
        second = corral("exec", "labwork", str(task), env=pool_env)
        assert (second.exit_code, second.stdout) == (0, "v2, longer\n"), second.stderr
    finally:
        corral("down", "labwork", env=pool_env)


def test_a_relaunch_to_the_pool_sends_only_changes_through_the_machines_cache(corral, pool_env, tmp_path,
                                                                             monkeypatch):
    """As on Slurm: the workdir goes to the machine's cache of its folder, then into the run dir as hard
    links (the unchanged file: the cache and both attempts); a file mount over a workdir file wins, and
    is never written into the cache. The prune reaches every machine of the pool."""
    import asyncio
    import hashlib
    import socket

    work = tmp_path / "work"
    work.mkdir()
    (work / "keep.txt").write_text("unchanged\n")
    (work / "change.txt").write_text("v1\n")
    (work / "shadow.txt").write_text("from the workdir\n")
    (tmp_path / "mount.txt").write_text("from the mount\n")
    task = tmp_path / "task.yaml"
    task.write_text(f"workdir: {work}\nfile_mounts:\n  shadow.txt: {tmp_path / 'mount.txt'}\n"
                    "resources:\n  infra: ssh/lab\nrun: cat change.txt shadow.txt; stat -c %h keep.txt\n")
    def sends() -> int:
        planned = corral("launch", "--dryrun", "--json", str(task), env=pool_env)
        assert planned.exit_code == 0, planned.stderr
        [row] = [r for r in planned.json() if r.get("feasible")]
        return row["transfer_bytes"]

    whole = sum(len(f.read_text()) for f in work.iterdir()) + len("from the mount\n")
    assert sends() == whole  # no machine has seen this workdir
    first = corral("launch", str(task), env=pool_env)
    assert (first.exit_code, first.stdout) == (0, "v1\nfrom the mount\n2\n"), first.stderr
    (work / "change.txt").write_text("v2, longer\n")
    assert sends() == len("v2, longer\n") + len("from the mount\n")  # what its machine's cache lacks, and the mount
    second = corral("launch", str(task), env=pool_env)
    assert (second.exit_code, second.stdout) == (0, "v2, longer\nfrom the mount\n3\n"), second.stderr
    key = hashlib.sha256(f"{socket.gethostname()}:{work}".encode()).hexdigest()[:16]
    cache = Path("/home/corral-test/.corral/cache") / key  # the testbed's machines share this home
    assert (cache / "shadow.txt").read_text() == "from the workdir\n"  # the mount went over a copy
    monkeypatch.setenv("CORRAL_SLURM_CONFIG", pool_env["CORRAL_SLURM_CONFIG"])
    subprocess.run(["touch", "-d", "3 days ago", f"{cache}.used"], check=True)
    from corral.client import Client

    client = Client()
    assert asyncio.run(client.infra("lab").prune_workdir_caches(1)) == 1
    assert [client.transport.round_trips[h] for h in ("lab1", "lab2", "lab3", "lab4")] == [1, 1, 1, 1]
    # The four machines pruned one shared home at once: one of them may have written a new marker for
    # the folder in the instant before another renamed it away; an orphan marker goes once it is old.
    marker = Path(f"{cache}.used")
    assert not cache.exists() and (not marker.exists() or time.time() - marker.stat().st_mtime < 600)


def test_a_sweep_to_the_pool_spreads_over_the_machines_cores_and_waits_in_their_queues(corral, pool_env, tmp_path):
    """130 CPU tasks, one core each, on four machines of two cores: 8 start at once, the others wait in
    the machines' queues and start as cores free up. Submissions to one machine go together
    (infra/sshpool/submissions.py): a round trip per 64 tasks and one rsync of the shared workdir per
    machine, not one per task."""
    env, calls = counting_ssh(tmp_path, pool_env)
    work = tmp_path / "work"
    work.mkdir()
    (work / "note.txt").write_text("shared\n")
    (tmp_path / "task.yaml").write_text("workdir: work\nresources:\n  infra: ssh/lab\n"
                                        "run: echo \"$CORRAL_JOB_RANK $(cat note.txt)\"\n")
    assert corral("gpus", "--infra", "ssh/lab", env=env).exit_code == 0  # the server, with the counting ssh
    before = len(calls())
    placed = corral("launch", "-d", "--json", "--num-jobs", "130", "task.yaml", env=env, cwd=tmp_path)
    assert placed.exit_code == 0, placed.stderr
    jobs = placed.json()  # in rank order
    spread = Counter(j["slurm_job_id"].split("/")[0] for j in jobs)
    assert len(jobs) == 130 and set(spread) == {"lab1", "lab2", "lab3", "lab4"}, spread
    assert max(spread.values()) - min(spread.values()) <= 2, spread  # by how much each has queued
    made = Counter(calls()[before:])
    # the launch's probe of each machine, then its ~33 submissions in one or two round trips (a first one
    # may go alone, the rest arriving meanwhile go together)
    assert all(2 <= made[host] <= 3 for host in spread) and sum(made.values()) <= 12, made
    rsyncs = [line for line in (tmp_path / "ssh-calls").read_text().splitlines() if "rsync --server" in line]
    assert sorted(line.split()[2] for line in rsyncs) == ["lab1", "lab2", "lab3", "lab4"], rsyncs  # once each
    for rank in (0, 64, 129):
        out = wait_for("its output", lambda r=rank: corral("logs", "--no-follow", jobs[r]["job_id"], env=env).stdout,
                       timeout=120)
        assert out == f"{rank} shared\n"

    def ended() -> list[dict]:
        rows = corral("queue", jobs[0]["job_id"], "--json", "--limit", "200", env=env).json()
        return rows if all(r["state"] in ("SUCCEEDED", "FAILED") for r in rows) else []

    rows = wait_for("every task to end", ended, timeout=120, interval=1)
    assert Counter(r["state"] for r in rows) == {"SUCCEEDED": 130}


def test_a_task_no_machine_can_start_now_waits_in_one_machines_queue(corral, pool_env):
    """Both A100 machines full: a third A100:4 task is accepted and waits in the queue of one of them
    (PENDING, saying why; the gpus table counts its GPUs as pending), and starts there as soon as that
    machine's GPUs are free."""
    blockers = [corral("launch", "-d", "--json", "--gpus", "A100:4", "--", "sleep 300", env=pool_env).json()
                for _ in range(2)]
    assert sorted(b["slurm_job_id"].split("/")[0] for b in blockers) == ["lab1", "lab2"]
    waiting = corral("launch", "-d", "--json", "--gpus", "A100:4", "--", 'echo "$CUDA_VISIBLE_DEVICES"',
                     env=pool_env)
    assert waiting.exit_code == 0, waiting.stderr
    host = waiting.json()["slurm_job_id"].split("/")[0]

    def row() -> dict:
        return next(j for j in corral("queue", "--json", env=pool_env).json() if j["job_id"] == waiting.json()["job_id"])

    assert wait_for("the machine's word on it", lambda: row()["reason"]) == (
        f"Resources (waiting on {host} for A100:4)")
    assert row()["state"] == "PENDING"
    gpus = corral("gpus", "--json", "--infra", "ssh/lab", env=pool_env)
    assert gpus.exit_code == 0, gpus.stderr
    a100 = next(r for r in gpus.json() if r["gpu"] == "A100")
    assert a100["free"] == 0 and a100["pending"] == 4
    blocker = next(b for b in blockers if b["slurm_job_id"].startswith(f"{host}/"))
    assert "cancelled" in corral("cancel", blocker["job_id"], env=pool_env).stdout
    out = wait_for("the waiting task's output", lambda: corral("logs", "--no-follow", waiting.json()["job_id"],
                                                               env=pool_env).stdout, timeout=60)
    assert out == "0,1,2,3\n"


@pytest.fixture(params=["shared home", "homes apart"])
def two_machine_env(request, pool_env, machines, testbed, tmp_path):
    """A pool of lab1 and lab2 only. "homes apart": lab2 is reached as another account (corral-bob, its
    own key), so the two machines have a home each, as most pools' machines do; the testbed's machines
    otherwise share one."""
    second = "lab2"
    if request.param == "homes apart":
        second = "lab2apart"
        key = testbed.paths.user_key("corral-bob")
        config = Path(pool_env["CORRAL_SLURM_CONFIG"])
        config.write_text(config.read_text() + f"\nHost lab2apart\n    HostName 10.201.0.12\n    User corral-bob\n"
                          f"    IdentityFile {key}\n    IdentitiesOnly yes\n"
                          f"    UserKnownHostsFile {machines.known_hosts}\n    StrictHostKeyChecking yes\n")
    pool = {"pools": {"lab": {"hosts": ["lab1", second]}}}
    (Path(pool_env["CORRAL_HOME"]) / "config.yaml").write_text(json.dumps(pool))
    yield pool_env, second
    if request.param == "homes apart":
        subprocess.run(["corral", "cancel", "--all"], env=pool_env, capture_output=True)
        subprocess.run(["ssh", "-F", pool_env["CORRAL_SLURM_CONFIG"], "lab2apart", "pkill -f corral/runs/; "
                        "rm -rf ~/.corral"], capture_output=True, timeout=30)


def test_a_waiting_task_moves_to_the_machine_that_frees_first(corral, two_machine_env):
    """Both machines' A100s are taken and a third A100:4 task waits in one machine's queue. The other
    machine frees first: the task moves there and starts (its handle, output and logs follow it), rather
    than waiting for the busy one, as a Slurm job waits for any node of its partition."""
    env, second = two_machine_env
    blockers = [corral("launch", "-d", "--json", "--gpus", "A100:4", "--", "sleep 300", env=env).json()
                for _ in range(2)]
    assert sorted(b["slurm_job_id"].split("/")[0] for b in blockers) == sorted(["lab1", second])
    waiting = corral("launch", "-d", "--json", "--gpus", "A100:4", "--", 'echo "$(hostname) $CUDA_VISIBLE_DEVICES"',
                     env=env).json()
    host = waiting["slurm_job_id"].split("/")[0]
    other = next(b for b in blockers if not b["slurm_job_id"].startswith(f"{host}/"))
    target = other["slurm_job_id"].split("/")[0]
    assert "cancelled" in corral("cancel", other["job_id"], env=env).stdout

    def moved() -> dict | None:
        row = next(j for j in corral("queue", "--json", env=env).json() if j["job_id"] == waiting["job_id"])
        there = row["slurm_job_id"].startswith(f"{target}/")
        return row if there and row["state"] in ("RUNNING", "SUCCEEDED") else None
    row = wait_for("the waiting task to move to the machine that freed up", moved, timeout=90, interval=1)
    assert row["slurm_job_id"] == f"{target}/{waiting['slurm_job_id'].split('/')[1]}"  # the same token
    out = wait_for("its output there", lambda: corral("logs", "--no-follow", waiting["job_id"], env=env).stdout,
                   timeout=30)
    assert out == f"{'lab1' if target == 'lab1' else 'lab2'} 0,1,2,3\n"  # lab2apart is lab2
    still = next(j for j in corral("queue", "--json", env=env).json() if j["slurm_job_id"].startswith(f"{host}/")
                 and j["job_id"] != waiting["job_id"])
    assert still["state"] == "RUNNING"  # the busy machine's task was left alone
    if second == "lab2apart":  # the copy it left behind (its env.sh with it) is gone from the other home
        run_dir = f"~/.corral/runs/{row['slurm_job_id'].split('/')[1]}"
        left = subprocess.run(["ssh", "-F", env["CORRAL_SLURM_CONFIG"], host, f"ls {run_dir}"],
                              capture_output=True, text=True, timeout=30)
        assert left.returncode != 0 and "No such file" in left.stderr, (left.stdout, left.stderr)


@pytest.mark.parametrize("crash", ["before the take", "after the take"])
def test_a_move_its_mover_left_half_done_is_finished_or_undone(corral, pool_env, machines, crash):
    """The engine died in the middle of a move (the scripts are run here by hand, as it would have):
    after the take, the next refresh finds the task on the machine that took it and adopts its new
    handle; before it, once the mark is old enough, the task goes back into its queue, and starts there.
    Never lost, never run twice."""
    blockers = [corral("launch", "-d", "--json", "--infra", "ssh/lab", "--gpus", "A100:4", "--", "sleep 300",
                       env=pool_env).json() for _ in range(2)]
    waiting = corral("launch", "-d", "--json", "--infra", "ssh/lab", "--gpus", "A100:4", "--", "echo ran",
                     env=pool_env).json()
    host, token = waiting["slurm_job_id"].split("/")
    other = "lab2" if host == "lab1" else "lab1"

    def on(machine: str, script: str) -> str:
        return subprocess.run(["ssh", "-F", str(machines.ssh_config), machine, "bash"], input=script,
                              capture_output=True, text=True, timeout=30).stdout

    withdrawn = on(host, moves.withdraw_script(token, other))
    assert "@@corral withdrawn" in withdrawn, withdrawn
    if crash == "after the take":
        entry = withdrawn.split()[-1]
        assert "@@corral submitted" in on(other, moves.take_script(token, entry)), "took"
        # The other machine has it waiting: its blocker ends, and the task starts there.
        corral("cancel", next(b["job_id"] for b in blockers if b["slurm_job_id"].startswith(f"{other}/")), env=pool_env)
        expected, handle = f"{other}/{token}", f"{other}/{token}"
    else:
        mark = f"~/.corral/runs/{token}/moving"  # the mover died long ago: its epoch, 1
        on(host, f"awk '{{$3 = 1; print}}' {mark} > {mark}.old && mv {mark}.old {mark}")
        corral("cancel", next(b["job_id"] for b in blockers if b["slurm_job_id"].startswith(f"{host}/")), env=pool_env)
        expected, handle = f"{host}/{token}", f"{host}/{token}"

    seen: list[dict] = []

    def ended() -> dict | None:
        seen.append(next(j for j in corral("queue", "--json", env=pool_env).json() if j["job_id"] == waiting["job_id"]))
        return seen[-1] if seen[-1]["state"] == "SUCCEEDED" else None
    try:
        row = wait_for("the task to run once, where it is", ended, timeout=90, interval=1)
    except BaseException:
        raise AssertionError(f"last seen: {seen[-2:]}") from None
    assert row["slurm_job_id"] == handle == expected
    assert corral("logs", "--no-follow", waiting["job_id"], env=pool_env).stdout == "ran\n"  # once


def test_a_pool_allocations_setup_is_shown_as_it_runs(corral, pool_env, tmp_path):
    """As on Slurm (tests/cli/test_dev.py): `launch -c` printed nothing of a pool holder's setup, only
    `STARTING (running setup)`, and a failed one's lines came in the error."""
    task = tmp_path / "task.yaml"
    task.write_text("resources:\n  infra: ssh/lab\nsetup: |\n  echo installing on $CORRAL_NODE_RANK\n  sleep 1\n"
                    "  echo installed\nrun: echo ran\n")
    try:
        up = corral("launch", "-c", "labsetup", str(task), env=pool_env)
        assert (up.exit_code, up.stdout) == (0, "installing on 0\ninstalled\nran\n"), up.stderr
        task.write_text("resources:\n  infra: ssh/lab\nsetup: |\n  echo 'pip: no such package' >&2\n  exit 4\n"
                        "run: echo never\n")
        failed = corral("launch", "-c", "labbroken", str(task), env=pool_env)
        assert failed.exit_code == 1 and "pip: no such package" in failed.stdout, (failed.stdout, failed.stderr)
        assert "setup failed with exit code 4; its output is above" in failed.stderr, failed.stderr
        # On two machines, each one's setup is shown (rank 0's alone was), whole lines each.
        task.write_text("resources:\n  infra: ssh/lab\n  accelerators: A100:1\nnum_nodes: 2\nsetup: |\n"
                        "  printf 'installing on '; sleep 0.5; echo \"$CORRAL_NODE_RANK\"\nrun: echo ran\n")
        pair = corral("launch", "-c", "labsetuppair", str(task), env=pool_env)
        assert pair.exit_code == 0, pair.stderr
        assert sorted(pair.stdout.splitlines()) == ["0: installing on 0", "0: ran", "1: installing on 1", "1: ran"], \
            pair.stdout
    finally:
        corral("down", "labsetup", "labbroken", "labsetuppair", env=pool_env)


def _on_machine(machines, handle: str, script: str) -> str:
    host, token = handle.split("/")
    return subprocess.run(["ssh", "-F", str(machines.ssh_config), host, script.replace("RUN", f".corral/runs/{token}")],
                          capture_output=True, text=True, timeout=30).stdout.strip()


def _launched_crashed_and_adopted(corral, pool_env, *resources: str) -> dict:
    """`sleep 300` launched on the pool by a server that dies right after the machines started it, before
    it wrote the handle down; its queue row once the next refreshes have found and adopted it (RUNNING)."""
    crashed = corral("launch", "-d", "--infra", "ssh/lab", *resources, "--", "sleep 300",
                     env={**pool_env, "CORRAL_TEST_CRASH_AFTER_SBATCH": "1"})
    assert crashed.exit_code == 69 and "the server stopped answering" in crashed.stderr, crashed.stderr

    def adopted() -> dict | None:
        [row] = corral("queue", "--json", env=pool_env).json()
        return row if row["state"] == "RUNNING" else None
    return wait_for("the task to be found and adopted", adopted, timeout=60, interval=1)


def test_a_task_whose_submission_was_never_recorded_is_found_by_its_token(corral, pool_env, machines):
    """The engine dies right after a machine started the task, before it wrote the handle down: the next
    refresh asks every machine of the pool for what no handle names, finds the task by its token and
    adopts it (RUNNING, with its handle), rather than calling it failed while it runs unseen."""
    row = _launched_crashed_and_adopted(corral, pool_env, "--gpus", "A100:1")
    assert re.fullmatch(r"lab[12]/[0-9a-f]{12}", row["slurm_job_id"]), row
    token = row["slurm_job_id"].split("/")[1]
    assert token in _on_machine(machines, row["slurm_job_id"], 'cat ~/.corral/pool/"$(hostname)"/held/*')  # its GPU
    assert "cancelled" in corral("cancel", row["job_id"], env=pool_env).stdout


def test_a_task_whose_submit_answer_was_lost_is_cancelled_where_it_runs(corral, pool_env, machines):
    """The machine started the task but its answer was lost (a dropped connection): the launch fails
    over and, with nowhere else to go, fails. The pool is then watched: the next refresh finds the
    task by its token on its machine and cancels it there, so it never runs on unseen."""
    lost = corral("launch", "-d", "--json", "--infra", "ssh/lab", "--gpus", "A100:1", "--", "sleep 300",
                  env={**pool_env, "CORRAL_TEST_LOSE_SUBMIT_ANSWER": "lab"})
    assert lost.exit_code == 69 and "the answer was lost" in lost.stderr, lost.stderr
    [row] = corral("queue", "--all", "--json", env=pool_env).json()  # a refresh: the pool is watched
    assert row["state"] == "SUBMIT_FAILED" and "lab had the job after all" in row["reason"], row
    assert wait_for("its process to end, cancelled", lambda: _on_machine(
        machines, row["slurm_job_id"],
        'test -e RUN/cancelled && read -r pid _ < RUN/pid && ! kill -0 "$pid" && echo yes'),
        timeout=30)


def test_a_multi_node_task_whose_submission_was_never_recorded_is_found_whole_or_cancelled(corral, pool_env):
    """The same for a 2-node task: both ranks are found by their token, one per machine, and the task is
    adopted as one (RUNNING, its handle naming both machines); and when the whole submission's answer
    is lost, both ranks are cancelled where they run."""
    row = _launched_crashed_and_adopted(corral, pool_env, "--gpus", "A100:4", "--num-nodes", "2")
    assert re.fullmatch(r"lab[12],lab[12]/[0-9a-f]{12}", row["slurm_job_id"]), row
    token = row["slurm_job_id"].split("/")[1]
    assert "cancelled" in corral("cancel", row["job_id"], env=pool_env).stdout
    wait_for("both ranks to end", lambda: subprocess.run(["pgrep", "-f", f"corral/runs/{token}"],
                                                         capture_output=True).returncode != 0, timeout=30)
    lost = corral("launch", "-d", "--json", "--infra", "ssh/lab", "--gpus", "A100:4", "--num-nodes", "2", "--",
                  "sleep 300", env={**pool_env, "CORRAL_TEST_LOSE_SUBMIT_ANSWER": "lab"})
    assert lost.exit_code == 69 and "the answer was lost" in lost.stderr, lost.stderr
    row = next(r for r in corral("queue", "--all", "--json", env=pool_env).json() if r["state"] == "SUBMIT_FAILED")
    assert "lab had the job after all" in row["reason"], row
    token = row["slurm_job_id"].split("/")[1]
    wait_for("both ranks to end, cancelled", lambda: subprocess.run(["pgrep", "-f", f"corral/runs/{token}"],
                                                                    capture_output=True).returncode != 0, timeout=30)
    a100 = next(r for r in corral("gpus", "--json", "--infra", "ssh/lab", env=pool_env).json() if r["gpu"] == "A100")
    assert a100["free"] == a100["total"], a100


def test_a_multi_node_task_found_in_part_after_a_crash_is_cancelled_never_adopted(corral, pool_env, machines):
    """A server killed half-way through starting a 2-node task's ranks: rank 0 runs, rank 1 never
    started (here: ended and its run dir removed before any refresh). The task is not adopted with a
    handle that misses a rank; its attempt is settled as never sent, and rank 0 is cancelled where it
    runs, its env.sh gone and its GPUs free again."""
    crashed = corral("launch", "-d", "--infra", "ssh/lab", "--gpus", "A100:4", "--num-nodes", "2", "--",
                     "sleep 300", env={**pool_env, "CORRAL_TEST_CRASH_AFTER_SBATCH": "1"})
    assert crashed.exit_code == 69 and "the server stopped answering" in crashed.stderr, crashed.stderr
    ranks = subprocess.run(["pgrep", "-af", r"corral/runs/[0-9a-f]{12}\.1/"], capture_output=True, text=True).stdout
    token = re.search(r"corral/runs/([0-9a-f]{12})\.1/", ranks).group(1)
    host = next(h for h in ("lab1", "lab2") if _on_machine(machines, f"{h}/{token}.1", "cat RUN/host") == h)
    _on_machine(machines, f"{host}/{token}.1", 'read -r pid _ < RUN/pid; kill -KILL -- "-$pid"; rm -rf RUN')
    assert not _on_machine(machines, f"{host}/{token}.1", "ls -d RUN 2>/dev/null")

    def cancelled() -> dict | None:
        [row] = corral("queue", "--all", "--json", env=pool_env).json()
        assert row["state"] in ("SUBMITTING", "SUBMIT_FAILED"), row  # never adopted RUNNING
        return row if "had part of the job after all" in (row["reason"] or "") else None
    row = wait_for("rank 0 to be found and cancelled", cancelled, timeout=60, interval=1)
    assert row["state"] == "SUBMIT_FAILED" and row["slurm_job_id"] is None, row
    wait_for("rank 0 to end", lambda: subprocess.run(["pgrep", "-f", f"corral/runs/{token}"],
                                                     capture_output=True).returncode != 0, timeout=30)
    assert not _on_machine(machines, f"lab1/{token}.0", "ls RUN/env.sh 2>/dev/null")  # its secrets gone
    a100 = next(r for r in corral("gpus", "--json", "--infra", "ssh/lab", env=pool_env).json() if r["gpu"] == "A100")
    assert a100["free"] == a100["total"], a100


def test_memory_a_task_asks_is_claimed_on_its_machine(corral, pool_env):
    """Each testbed machine has the host's MemTotal (about 24 GB). Two A100:1 tasks asking 14 GB each
    take different machines though lab1 has A100s free (its memory is taken); a third waits in a queue,
    saying it waits for memory, and `corral gpus` counts its GPU as pending."""
    launched = [corral("launch", "-d", "--json", "--infra", "ssh/lab", "--gpus", "A100:1", "--memory", "14", "--",
                       "sleep 300", env=pool_env) for _ in range(3)]
    assert [r.exit_code for r in launched] == [0, 0, 0], [r.stderr for r in launched]
    hosts = [r.json()["slurm_job_id"].split("/")[0] for r in launched]
    assert sorted(hosts[:2]) == ["lab1", "lab2"], hosts
    waiting = launched[2].json()["job_id"]

    def reason() -> str | None:
        return next(j for j in corral("queue", "--json", env=pool_env).json() if j["job_id"] == waiting)["reason"]
    assert wait_for("the third task's reason", reason) == (
        f"Resources (waiting on {hosts[2]} for A100:1 and 14336 MB of memory)")
    a100 = next(r for r in corral("gpus", "--json", "--infra", "ssh/lab", env=pool_env).json() if r["gpu"] == "A100")
    assert a100["pending"] == 1 and a100["free"] == 6, a100


def test_a_pool_task_using_more_memory_than_it_asked_for_fails_out_of_memory(corral, pool_env):
    """Its memory was claimed and never enforced: a task asking 0.1 GB could use the machine's all. Now
    it fails as Slurm's OverMemoryKill ends one, its own doing; its GPUs and memory are free again."""
    hog = 'import time; b = bytearray(300 * 2**20); print("allocated", flush=True); time.sleep(601)'
    job = corral("launch", "-d", "--json", "--infra", "ssh/lab", "--gpus", "A100:1", "--memory", "0.1", "--",
                 f"python3 -c '{hog}'", env=pool_env).json()
    wait_for("the task to run", lambda: runs_somewhere("python3", "-c", hog), timeout=8)  # looked at every 10 s
    ended = wait_for("the memory watchdog", lambda: (j := corral("queue", "--json", job["job_id"], env=pool_env)
                                                     .json()[0])["state"] == "FAILED" and j, timeout=40)
    host = job["slurm_job_id"].split("/")[0]
    assert re.fullmatch(rf"OUT_OF_MEMORY \(it used 3\d\d MB of memory on {host}, more than the 103 MB it asked "
                        r"for\)", ended["reason"]), ended
    log = corral("logs", job["job_id"], env=pool_env).stdout
    assert log.startswith("allocated\ncorral: *** the task used 3"), log
    wait_for("the task's process to end", lambda: not runs_somewhere("python3", "-c", hog), timeout=15)
    free = {r["gpu"]: r["free"] for r in corral("gpus", "--json", "--infra", "ssh/lab", env=pool_env).json()}
    assert free["A100"] == 8


def test_a_walltime_ends_a_pool_task_and_a_pool_allocation(corral, pool_env):
    """`--time` on a pool: counted from the start, as Slurm's; the task fails TIMEOUT (its own doing), an
    allocation ends with its walltime, and their GPUs are free again."""
    task = corral("launch", "-d", "--json", "--gpus", "A100:1", "--time", "0:03", "--", "echo started; sleep 300",
                  env=pool_env).json()
    up = corral("launch", "-c", "shortdev", "--infra", "ssh/lab", "--gpus", "A100:1", "--time", "0:12", "--json",
                env=pool_env)
    assert up.exit_code == 0, up.stderr
    status = next(s for s in corral("status", "--json", env=pool_env).json() if s["name"] == "shortdev")
    assert status["state"] == "READY" and re.fullmatch(r"0:00:(0\d|1[0-2])", status["time_left"]), status
    # An exec still running at the walltime ends with the allocation, as a Slurm job's steps do.
    running = subprocess.Popen([sys.executable, "-m", "corral", "exec", "shortdev", "--", "echo in; sleep 3023"],
                               env=pool_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # So does an ssh session (on Slurm, a step too); it went on before, on GPUs given back.
    shell = subprocess.Popen([sys.executable, "-m", "corral", "ssh", "shortdev", "--", "echo in; sleep 3029"],
                             env=pool_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job = wait_for("the task's walltime", lambda: (j := corral("queue", "--json", task["job_id"], env=pool_env)
                                                   .json()[0])["state"] == "FAILED" and j, timeout=30)
    assert job["reason"].startswith("TIMEOUT (it reached its time limit on lab"), job
    assert "started\ncorral: *** the task reached its time limit" in corral("logs", task["job_id"], env=pool_env).stdout
    ended = wait_for("the allocation's walltime", lambda: (s := next(
        s for s in corral("status", "--json", env=pool_env).json() if s["name"] == "shortdev"))["state"] == "ENDED"
        and s, timeout=30)
    assert ended["reason"] == "walltime ended", ended  # as Slurm's TIMEOUT says it
    out, _ = running.communicate(timeout=45)
    assert running.returncode != 0 and out == "in\n", out
    wait_for("the exec's processes to end", lambda: not runs_somewhere("sleep", "3023"), timeout=15)
    out, _ = shell.communicate(timeout=45)
    assert shell.returncode != 0 and out == "in\n", out
    wait_for("the session's processes to end", lambda: not runs_somewhere("sleep", "3029"), timeout=15)
    free = {r["gpu"]: r["free"] for r in corral("gpus", "--json", "--infra", "ssh/lab", env=pool_env).json()}
    assert free["A100"] == 8


@pytest.mark.parametrize("two_machine_env", ["homes apart"], indirect=True)
def test_a_move_whose_copy_fails_puts_the_task_back_at_once(two_machine_env, monkeypatch):
    """The run dir cannot be copied to the other home (a file stands where it would go): no take was
    sent, so the task is back in its first machine's queue in the same pass, not after the 2-minute
    grace, and the next try, once the way is clear, moves it."""
    import asyncio

    from corral.client import Client
    from corral.infra.base import JobRequest, new_token

    env, second = two_machine_env
    monkeypatch.setenv("CORRAL_SLURM_CONFIG", env["CORRAL_SLURM_CONFIG"])

    def request(run: str) -> JobRequest:
        return JobRequest(token=new_token(), task_ids=("c-000000000001",), place="lab", num_nodes=1,
                          accelerator_type=None, accelerators_per_node=4, cpus_per_node=None, memory_mb=None,
                          envs={}, setup=None, run=run)

    async def scenario() -> tuple:
        pool = Client().infra("lab")
        await pool.probe()
        holder, waiting = request("sleep 300"), request("echo moved")
        for task in (holder, waiting):
            files = {"job.sh": runner.job_script(task, "lab"), "env.sh": "", "setup.sh": "", "run.sh": task.run}
            await pool.transport.run("lab1", runner.submit_script(task, "lab", files, may_queue=True), timeout=30)
        run_dir = f"~/.corral/runs/{waiting.token}"
        await pool.transport.run(second, f"mkdir -p ~/.corral/runs && touch {run_dir}", timeout=30)
        failed = await pool._move("lab1", waiting.token, second)
        left = (await pool.transport.run("lab1", f"ls {run_dir}", timeout=30)).stdout.split()
        await pool.transport.run(second, f"rm -f {run_dir}", timeout=30)
        moved = await pool._move("lab1", waiting.token, second)
        await pool.cancel([f"lab1/{holder.token}"], [""])
        return failed, left, moved, waiting.token

    failed, left, moved, token = asyncio.run(scenario())
    assert failed is None
    assert "queued" in left and "moving" not in left, left  # back in its queue, no mark left for later
    assert moved is not None and moved.handle == f"{second}/{token}" and moved.moved, moved


def test_an_image_runs_on_the_pool_where_every_machine_has_a_runtime(corral, pool_env, machines):
    """Every machine has the testbed's stand-in apptainer, so the pool offers it: setup and run go through
    the task's container.sh (the image named, `--nv` with GPUs). Take it from one machine and the pool
    offers none, and the plan says so."""
    gpu = corral("launch", "-d", "--json", "--image-id", "docker:ubuntu:22.04", "--gpus", "A100:1", "--",
                 'echo "in $CORRAL_TESTBED_CONTAINER gpus=${CORRAL_TESTBED_CONTAINER_GPUS:-0} $CUDA_VISIBLE_DEVICES"',
                 env=pool_env)
    assert gpu.exit_code == 0, gpu.stderr
    job = gpu.json()
    assert job["cluster"] == "lab"
    out = wait_for("its output", lambda: corral("logs", "--no-follow", job["job_id"], env=pool_env).stdout)
    assert out == "in ubuntu:22.04 gpus=1 0\n"
    cpu = corral("launch", "--infra", "ssh/lab", "--image-id", "docker:python:3.12-slim", "--cpus", "1", "--",
                 'echo "in $CORRAL_TESTBED_CONTAINER gpus=${CORRAL_TESTBED_CONTAINER_GPUS:-0}"', env=pool_env)
    assert (cpu.exit_code, cpu.stdout) == (0, "in python:3.12-slim gpus=0\n"), cpu.stderr
    standin = machines.paths("lab4").bin / "apptainer"
    standin.rename(standin.with_name("apptainer.away"))
    fresh = {**pool_env, "CORRAL_HOME": pool_env["CORRAL_HOME"] + "-fresh"}  # a new probe
    try:
        Path(fresh["CORRAL_HOME"]).mkdir()
        (Path(fresh["CORRAL_HOME"]) / "config.yaml").write_text((Path(pool_env["CORRAL_HOME"]) / "config.yaml")
                                                                .read_text())
        plan = corral("launch", "--dryrun", "--json", "--image-id", "docker:ubuntu:22.04", "--gpus", "A100:1",
                      "--", "true", env=fresh)
        [row] = [r for r in plan.json() if r.get("cluster") == "lab"]
        assert not row["feasible"] and "lab has none" in row["reason"], row
    finally:
        standin.with_name("apptainer.away").rename(standin)
        corral("server", "stop", env=fresh)


def test_a_pool_allocation_with_an_image_runs_its_setup_execs_and_shells_in_it(corral, pool_env, tmp_path):
    """As on Slurm (test_dev.py): the holder writes container.sh, and setup, each exec and each `corral ssh`
    go through it, with `--nv` for an allocation holding GPUs."""
    task = tmp_path / "image.yaml"
    task.write_text("resources:\n  infra: ssh/lab\n  image_id: docker:ubuntu:22.04\n  accelerators: A100:1\n"
                    'setup: echo "setup in $CORRAL_TESTBED_CONTAINER"\n')
    up = corral("launch", "-c", "labimage", str(task), env=pool_env)
    assert (up.exit_code, up.stdout) == (0, "setup in ubuntu:22.04\n"), up.stderr
    said = ('echo "in ${CORRAL_TESTBED_CONTAINER:-no image} gpus=${CORRAL_TESTBED_CONTAINER_GPUS:-0} '
            '$CUDA_VISIBLE_DEVICES"')
    held = next(s for s in corral("status", "--json", env=pool_env).json() if s["name"] == "labimage")
    ran = corral("exec", "labimage", "--gpus", "A100:1", "--", said, env=pool_env)
    assert ran.exit_code == 0, ran.stderr
    words = ran.stdout.split()
    assert words[:2] == ["in", "ubuntu:22.04"] and words[2] == "gpus=1", ran.stdout
    shell = corral("ssh", "labimage", "--", said, env=pool_env)
    assert (shell.exit_code, shell.stdout) == (0, ran.stdout), shell.stderr  # the same GPU: the one held
    assert held["state"] == "READY" and held["infra"] == "ssh/lab"
    assert corral("down", "labimage", env=pool_env).exit_code == 0


POOL_GROUP = """\
name: labgroup
execution: parallel
---
name: server
resources: {infra: ssh/lab, accelerators: "A100:1"}
run: echo "server on $(hostname)"; sleep 20
---
name: client
resources: {infra: ssh/lab, accelerators: "A10G:1"}
run: |
  for i in $(seq 60); do [ -s "$CORRAL_JOBGROUP_HOSTS/server-0" ] && break; sleep 1; done
  echo "client on $(hostname) reaches server at $(cat "$CORRAL_JOBGROUP_HOSTS/server-0")"
"""


def test_a_job_group_on_the_pool_finds_its_tasks_through_the_shared_home(corral, pool_env, tmp_path):
    """A job group's tasks on a pool had no CORRAL_JOBGROUP_HOSTS: the client waited for a file that
    never came. Each rank now writes its machine's address there, as on Slurm, in the home the pool's
    machines share (the testbed's do); a pool whose homes are apart is left out, saying why."""
    env = {**pool_env, "CORRAL_CONTROLLER_INTERVAL": "1"}
    (tmp_path / "group.yaml").write_text(POOL_GROUP)
    ran = corral("jobs", "launch", "group.yaml", env=env, cwd=tmp_path)
    assert ran.exit_code == 0, ran.stderr
    client = next(line for line in ran.stdout.splitlines() if line.startswith("client on "))
    words = client.split()
    assert words[2] == "lab4" and re.fullmatch(r"\d+\.\d+\.\d+\.\d+", words[-1]), client  # the A10G machine
    server = next(line for line in ran.stdout.splitlines() if line.startswith("server on "))
    assert server.split()[2] in ("lab1", "lab2", "lab3"), server


@pytest.mark.parametrize("two_machine_env", ["homes apart"], indirect=True)
def test_a_job_group_is_not_placed_on_a_pool_whose_machines_have_homes_apart(corral, two_machine_env, tmp_path):
    env, _second = two_machine_env
    env = {**env, "CORRAL_CONTROLLER_INTERVAL": "1"}
    (tmp_path / "group.yaml").write_text(POOL_GROUP.replace('accelerators: "A10G:1"', 'accelerators: "A100:1"'))
    launched = corral("jobs", "launch", "-d", "--json", "group.yaml", env=env, cwd=tmp_path)
    assert launched.exit_code == 0, launched.stderr
    ids = launched.json()["job_ids"]
    try:
        def reasons() -> list[str] | None:
            rows = {j["job_id"]: j for j in corral("jobs", "queue", "-a", "--json", env=env).json()}
            said = [rows[i]["reason"] or "" for i in ids]
            return said if all("do not share one home" in r for r in said) else None
        said = wait_for("the group's reasons", reasons, timeout=30)
        why = "ssh/lab: its machines do not share one home, through which a job group's tasks find each other " \
              "(CORRAL_JOBGROUP_HOSTS)"
        for reason in said:
            assert reason.startswith("no cluster can run every task of its job group now: "), reason
            assert f"server: {why}" in reason and f"client: {why}" in reason, reason
        assert {j["state"] for j in corral("jobs", "queue", "-a", "--json", env=env).json()
                if j["job_id"] in ids} == {"PENDING"}
    finally:
        corral("jobs", "cancel", *ids, env=env)
