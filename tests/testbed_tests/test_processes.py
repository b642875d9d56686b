"""The testbed's process helpers: a pid file names its own process, never a later one with its pid."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.processes import PID_REUSE_SLACK, running, started_at


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_pid_file_written_after_its_process_began_names_it(tmp_path: Path, sleeper) -> None:
    pidfile = tmp_path / "daemon.pid"
    pidfile.write_text(f"{sleeper.pid}\n")
    assert running(pidfile) == sleeper.pid


def test_a_process_that_began_after_the_pid_file_is_another_one(tmp_path: Path, sleeper) -> None:
    # What a CI run leaves: the file of a daemon stopped long ago, its pid now someone else's.
    pidfile = tmp_path / "daemon.pid"
    pidfile.write_text(f"{sleeper.pid}\n")
    long_ago = time.time() - 3600
    os.utime(pidfile, (long_ago, long_ago))
    assert running(pidfile) is None


def test_a_process_of_the_program_the_file_is_named_for_is_its_daemon_whatever_the_clock(tmp_path: Path,
                                                                                         sleeper) -> None:
    """After the wall clock was stepped forward, a daemon's start time, counted from the boot time, came
    after its pid file's: every daemon seemed gone. The file's name says which program it is for."""
    long_ago = time.time() - 3600
    for name, expected in (("sleep.pid", sleeper.pid), ("slurmd-b2.pid", None), ("daemon.pid", None)):
        pidfile = tmp_path / name
        pidfile.write_text(f"{sleeper.pid}\n")
        os.utime(pidfile, (long_ago, long_ago))
        assert running(pidfile) == expected, name


def test_start_times_are_those_of_the_processes(sleeper) -> None:
    began, ours = started_at(sleeper.pid), started_at(os.getpid())
    assert began is not None and ours is not None
    assert abs(began - time.time()) < PID_REUSE_SLACK + 60
    assert ours <= began  # this test's process started the sleeper


def test_no_process_and_no_file_are_not_running(tmp_path: Path) -> None:
    finished = subprocess.Popen(["true"])
    finished.wait()
    pidfile = tmp_path / "daemon.pid"
    assert running(pidfile) is None
    pidfile.write_text(f"{finished.pid}\n")
    assert running(pidfile) is None
