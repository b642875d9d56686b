"""Submitter tags name one process, and tell whether it still runs."""

from __future__ import annotations

import socket

from corral.liveness import process_tag, quiet_senders, tag_alive
from tests.helpers import dead_leader_with_child, dead_tag


def test_this_process_is_alive_and_a_finished_one_is_not():
    assert tag_alive(process_tag()) is True
    child = dead_tag()
    assert child.startswith(socket.gethostname() + ":") and tag_alive(child) is False


def test_a_reused_pid_is_not_the_same_process():
    host, pid, start = process_tag().rsplit(":", 2)
    assert tag_alive(f"{host}:{pid}:{int(start) + 1}") is False


def test_what_this_machine_cannot_tell_is_unknown():
    assert tag_alive(None) is None and tag_alive("") is None and tag_alive("garbage") is None
    assert tag_alive(f"another-host-{socket.gethostname()}:1:1") is None


def test_a_dead_submitter_is_quiet_once_nothing_left_in_its_session_runs():
    assert quiet_senders([process_tag(), None, "garbage"]) == set()  # alive, or cannot tell
    gone = dead_tag()
    assert quiet_senders([gone]) == {gone}
    with dead_leader_with_child() as (leader, end_child):
        assert quiet_senders([leader, gone]) == {gone}  # its child (an ssh still sending) runs on
        end_child()
        assert quiet_senders([leader]) == {leader}
