"""Which process is doing something, and whether it still lives: a submission is tagged with its
submitter (`host:pid:start`), so that one whose process died (kill -9, a closed laptop lid is not
one), and left nothing that may still be sending it, is settled on the next refresh instead of after a
grace period. Cost: one read of /proc/PID/stat per tag; a dead one also costs a scan of /proc."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable

# The attempt tokens this process is submitting now: recorded, their files being sent, their answer not
# yet written down. However long an upload takes, such an attempt is not settled as never sent.
SENDING: set[str] = set()


class Sending:
    """One submission's tokens, in SENDING from when each is recorded (`add`) until the submission's
    outcome is written, or it raised (the end of the `with`)."""

    def __init__(self) -> None:
        self.tokens: set[str] = set()

    def add(self, tokens: Iterable[str]) -> None:
        self.tokens.update(tokens)
        SENDING.update(self.tokens)

    def __enter__(self) -> Sending:
        return self

    def __exit__(self, *_: object) -> None:
        SENDING.difference_update(self.tokens)


def _stat(pid: int | str) -> list[str] | None:
    """/proc/PID/stat's fields after the command name: [0] the state, [2] the process group, [3] the
    session, [19] the start time since boot (in clock ticks)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields if len(fields) > 19 else None


def _start_time(pid: int) -> str | None:
    """The process's start time: with the pid, it names one process."""
    fields = _stat(pid)
    return fields[19] if fields else None


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


def quiet_senders(tags: Iterable[str | None]) -> set[str]:
    """Those of these tags whose process is gone and left nothing that may still be sending what it
    submitted: no live process in a process group or session it led. The server leads its session,
    and its `ssh … sbatch` clients outlive a kill -9 of it, finishing the submission on the cluster; an
    attempt is settled as never sent only once they are gone too. A submitter that led neither keeps
    the rule of `tag_alive` (its children cannot be told from its parent's)."""
    dead = {tag: int(tag.rsplit(":", 2)[1]) for tag in set(tags) if tag and tag_alive(tag) is False}
    if not dead:
        return set()
    leaders: set[int] = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (fields := _stat(entry.name)) and fields[0] != "Z":
            leaders.update((int(fields[2]), int(fields[3])))
    return {tag for tag, pid in dead.items() if pid not in leaders}
