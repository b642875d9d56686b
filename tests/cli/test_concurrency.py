"""One engine per store, whatever happens: commands at the same moment, and a launch killed while it
records a sweep. On the real testbed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import wait_for


def controllers_of(home: str) -> list[int]:
    """Pids of controller processes running for this Corral home. A child the controller has forked but
    not yet exec'd (an ssh it starts) shows its parent's command line and environment: it is left out."""
    found: dict[int, int] = {}  # pid -> parent pid
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if b"corral.controller" in cmdline and f"CORRAL_HOME={home}".encode() in environ:
            found[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    return sorted(pid for pid, parent in found.items() if parent not in found)


def corral_at_once(env: dict[str, str], argvs: list[list[str]]) -> list[subprocess.CompletedProcess[str]]:
    procs = [subprocess.Popen([sys.executable, "-m", "corral", *argv], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for argv in argvs]
    results = []
    for proc, argv in zip(procs, argvs):
        out, err = proc.communicate(timeout=120)
        results.append(subprocess.CompletedProcess(argv, proc.returncode, out, err))
    return results


def test_managed_jobs_launched_at_once_start_one_controller(corral, corral_env, clean_queues):
    home = corral_env["CORRAL_HOME"]
    env = {**corral_env, "CORRAL_CONTROLLER_INTERVAL": "1"}
    try:
        results = corral_at_once(env, [["jobs", "launch", "-d", "--cpus", "1", "--infra", "slurm/alpine/cpu", "--", "true"]
                                       for _ in range(12)])
        assert [r.returncode for r in results] == [0] * 12, [r.stderr for r in results]
        assert len(controllers_of(home)) == 1
        ids = {r.stdout.strip() for r in results}
        assert len(ids) == 12
        wait_for("every job to succeed", lambda: {j["job_id"] for j in corral("jobs", "queue", "-a", "--json",
                                                                               env=env).json()
                                                  if j["state"] == "SUCCEEDED"} >= ids, timeout=120)
        status = corral("server", "status", "--json", env=env).json()
        assert status["pid"] == controllers_of(home)[0] and status["lease"]["holder"].endswith(f":{status['pid']}")
    finally:
        corral("server", "stop", env=env)
    wait_for("no controller left", lambda: controllers_of(home) == [], timeout=30)


def test_two_launches_of_one_name_at_once_hold_one_allocation(corral, corral_env, clean_queues):
    results = corral_at_once(corral_env, [["launch", "-c", "twin", "-d", "--json", "--gpus", "L4:1"]] * 2)
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    import json

    answers = [json.loads(r.stdout) for r in results]
    assert answers[0]["slurm_job_id"] == answers[1]["slurm_job_id"]
    assert sorted(a["new"] for a in answers) == [False, True]
    assert corral("down", "twin").exit_code == 0


def test_a_launch_killed_while_recording_a_sweep_loses_no_job(corral, corral_env, clean_queues):
    """The engine (the server) dies right after Slurm accepted its first share (before recording it): every job of
    the sweep is then either submitted (found by its token and adopted) or reported failed at once."""
    env = {**corral_env, "CORRAL_TEST_CRASH_AFTER_SBATCH": "1"}
    crashed = corral("launch", "-d", "--num-jobs", "300", "--cpus", "1", "--infra", "slurm/alpine/cpu", "--",
                     "true", env=env)
    assert crashed.exit_code == 69 and "the server stopped answering" in crashed.stderr
    rows = corral("queue", "--all", "--json").json()
    assert len(rows) == 300
    states = {row["state"] for row in rows}
    assert "SUBMITTING" not in states and states <= {"PENDING", "STARTING", "RUNNING", "SUCCEEDED", "SUBMIT_FAILED"}
    assert any(row["state"] != "SUBMIT_FAILED" for row in rows)  # the accepted share was adopted
