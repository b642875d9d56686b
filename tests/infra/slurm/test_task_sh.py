"""The task wrapper every Slurm job runs (TASK_SH), run by real bash: a task that starts with SIGTERM
blocked (as slurmstepd can hand it on when it launches a task while killing the step) still ends at
SIGTERM, and at the cancel marker; a marker already there stops the task before it starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corral.infra.slurm.jobscript import TASK_SH
from tests.conftest import wait_for

# Starts TASK_SH in its own process group with SIGTERM blocked, as a task of that race starts.
BLOCKED_START = """
import os, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGCHLD})
os.setsid()
os.execvp("bash", ["bash", sys.argv[1], "", sys.argv[2], sys.argv[3]])
"""


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    (tmp_path / "workdir").mkdir()
    (tmp_path / "task.sh").write_text(TASK_SH)
    (tmp_path / "env.sh").write_text("")
    (tmp_path / "run.sh").write_text(f'echo started > {tmp_path}/out; sleep 30; echo ran on >> {tmp_path}/out\n')
    return tmp_path


def start(run_dir: Path, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    env = {**os.environ, "CORRAL_RUN_DIR": str(run_dir), "SLURM_NODEID": "0", **(extra_env or {})}
    env.pop("SLURM_ARRAY_TASK_ID", None)
    return subprocess.Popen([sys.executable, "-c", BLOCKED_START, str(run_dir / "task.sh"), str(run_dir / "run.sh"),
                             str(run_dir / "env.sh")], env=env)


def ended_within(proc: subprocess.Popen, seconds: float) -> bool:
    try:
        proc.wait(timeout=seconds)
        return True
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return False


def test_a_task_started_with_sigterm_blocked_ends_at_sigterm(run_dir):
    proc = start(run_dir)
    wait_for("the task to start", lambda: (run_dir / "out").exists(), timeout=10)
    blocked = Path(f"/proc/{proc.pid}/status").read_text().split("SigBlk:")[1].split()[0]
    assert not (int(blocked, 16) >> 14) & 1  # unblocked before the task ran
    os.killpg(proc.pid, signal.SIGTERM)  # what Slurm's kill sends
    assert ended_within(proc, 5)
    assert proc.returncode == -signal.SIGTERM and "ran on" not in (run_dir / "out").read_text()


def test_the_cancel_marker_ends_a_task_that_cannot_be_unblocked_with_kill(run_dir):
    # As if neither env --default-signal nor perl were there: TERM stays blocked, so the fence's
    # watcher must send KILL at once rather than wait 10 s for a TERM that is never seen.
    proc = start(run_dir, {"CORRAL_TERM_UNBLOCKED": "1"})
    wait_for("the task to start", lambda: (run_dir / "out").exists(), timeout=10)
    started = time.monotonic()
    (run_dir / "cancelled").touch()
    assert ended_within(proc, 5)
    assert time.monotonic() - started < 3 and proc.returncode == -signal.SIGKILL
    assert "ran on" not in (run_dir / "out").read_text()
    assert "sending KILL" in (run_dir / "fence.log").read_text()


def test_a_marker_left_before_the_task_starts_stops_it(run_dir):
    (run_dir / "cancelled").touch()
    proc = start(run_dir)
    assert ended_within(proc, 5) and proc.returncode == 143
    assert not (run_dir / "out").exists()
    assert "before the task started" in (run_dir / "fence.log").read_text()


def test_with_container_sh_setup_and_run_go_through_it_in_the_task_env(run_dir):
    (run_dir / "setup.sh").write_text(f"echo setup $IN_IMAGE $GREETING >> {run_dir}/out\n")
    (run_dir / "run.sh").write_text(f"echo run $IN_IMAGE $GREETING >> {run_dir}/out\n")
    (run_dir / "env.sh").write_text("export GREETING=hi PATH=/nowhere\n")  # the task's PATH cannot break it
    # A stand-in runtime: marks what runs "in the image", then runs it (as `apptainer exec … "$@"` does).
    (run_dir / "container.sh").write_text('#!/bin/bash\nIN_IMAGE=yes exec "$@"\n')
    env = {**os.environ, "CORRAL_RUN_DIR": str(run_dir), "SLURM_NODEID": "0"}
    env.pop("SLURM_ARRAY_TASK_ID", None)
    done = subprocess.run(["bash", str(run_dir / "task.sh"), str(run_dir / "setup.sh"), str(run_dir / "run.sh"),
                           str(run_dir / "env.sh")], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert (run_dir / "out").read_text() == "setup yes hi\nrun yes hi\n"
