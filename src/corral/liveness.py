"""Which process is doing something, and whether it still lives: a submission is tagged with its
submitter (`host:pid:start`), so that one whose process died (kill -9, a closed laptop lid is not
one) is settled on the next refresh instead of after a grace period. Cost: one read of /proc."""

from __future__ import annotations

import os
import socket


def _start_time(pid: int) -> str | None:
    """The process's start time since boot (in clock ticks): with the pid, it names one process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def process_tag() -> str:
    """This process, as `host:pid:start`."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid()) or '?'}"


def tag_alive(tag: str | None) -> bool | None:
    """True if the tagged process still runs, False if it is gone, None if this machine cannot tell
    (no tag, another host, no /proc)."""
    if not tag or tag.count(":") < 2:
        return None
    host, pid, start = tag.rsplit(":", 2)
    if host != socket.gethostname() or not pid.isdigit() or start == "?" or not os.path.isdir("/proc/self"):
        return None
    return _start_time(int(pid)) == start
