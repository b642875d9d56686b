"""Submitter tags name one process, and tell whether it still runs."""

from __future__ import annotations

import socket
import subprocess
import sys

from corral.liveness import process_tag, tag_alive


def test_this_process_is_alive_and_a_finished_one_is_not():
    assert tag_alive(process_tag()) is True
    child = subprocess.run([sys.executable, "-c", "from corral.liveness import process_tag; print(process_tag())"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert child.startswith(socket.gethostname() + ":") and tag_alive(child) is False


def test_a_reused_pid_is_not_the_same_process():
    host, pid, start = process_tag().rsplit(":", 2)
    assert tag_alive(f"{host}:{pid}:{int(start) + 1}") is False


def test_what_this_machine_cannot_tell_is_unknown():
    assert tag_alive(None) is None and tag_alive("") is None and tag_alive("garbage") is None
    assert tag_alive(f"another-host-{socket.gethostname()}:1:1") is None
