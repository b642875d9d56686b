"""A job group's header, checked: which of its tasks are auxiliary, and how long each waits once the
primary tasks have ended before it is stopped. Pure; no I/O.

A job group (SkyPilot's `execution: parallel`) runs its tasks side by side on one cluster. Its header's
`primary_tasks` names the tasks that drive it (all of them when absent); the others are auxiliary
(a data server, a replay buffer) and are stopped once every primary task has ended, after the header's
`termination_delay`: one duration for all (`30s`, `5m`, `1h`, or seconds), or a mapping of task name
to duration with an optional `default`.
"""

from __future__ import annotations

import re
from typing import Any

from corral.errors import TaskError

MAX_TERMINATION_DELAY = 24 * 3600.0
_UNITS = {"s": 1, "m": 60, "h": 3600}
# A task's name in a group names a file of its nodes (CORRAL_JOBGROUP_HOSTS/NAME-RANK), and in SkyPilot
# a host (NAME-0.GROUP): letters, digits and dashes, as a host name's label.
_TASK_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\Z", re.ASCII)


def parse_delay(value: object, where: str) -> float:
    """A termination delay in seconds: `30s`, `5m`, `1h`, or a number of seconds."""
    seconds: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        raw = value.strip().lower()
        unit = _UNITS.get(raw[-1:], None)
        number = raw[:-1] if unit else raw
        try:
            seconds = float(number) * (unit or 1)
        except ValueError:
            seconds = None
    if seconds is None or not 0 <= seconds <= MAX_TERMINATION_DELAY:  # NaN fails both comparisons
        raise TaskError(f"{where}: {value!r} is not a delay: give seconds or a duration such as 30s, 5m or 1h "
                        f"(at most {MAX_TERMINATION_DELAY / 3600:g} h)")
    return seconds


def auxiliary_delays(names: list[str | None], primary_tasks: list[str] | None, termination_delay: Any,
                     source: str = "the job group") -> list[float | None]:
    """For each task of a job group (by its `name`), None when it is primary, else how many seconds it
    runs on once every primary task has ended. Every task needs a name of its own: the header and
    the other tasks (their CORRAL_JOBGROUP_HOSTS files) name it."""
    seen: set[str] = set()
    for number, name in enumerate(names):
        if not name:
            raise TaskError(f"{source}: task {number} has no `name`: every task of a job group needs one, "
                            "which primary_tasks and the other tasks use")
        if not _TASK_NAME.match(name):
            raise TaskError(f"{source}: task {number}'s name {name!r}: a job group's task is named with letters, "
                            "digits and dashes (as a host name), since the other tasks find it by that name")
        if name in seen:
            raise TaskError(f"{source}: two tasks are named {name!r}: a job group's task names must differ")
        seen.add(name)
    if primary_tasks is not None:
        if not primary_tasks:
            raise TaskError(f"{source}: primary_tasks is empty: name at least one task, or leave it out (then "
                            "every task is primary)")
        if unknown := [p for p in primary_tasks if p not in seen]:
            raise TaskError(f"{source}: primary_tasks names {unknown[0]!r}, which is no task of the group "
                            f"(its tasks: {', '.join(n for n in names if n)})")
    delays = _delays(termination_delay, seen, source)
    return [None if is_primary(name, primary_tasks) else delays.get(str(name), delays.get("default", 0.0))
            for name in names]


def is_primary(name: str | None, primary_tasks: list[str] | None) -> bool:
    """Is the task so named one of its group's primary tasks (every task is when none are named)?"""
    return primary_tasks is None or name in primary_tasks


def _delays(value: Any, names: set[str], source: str) -> dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        return {"default": parse_delay(value, f"{source}: termination_delay")}
    out: dict[str, float] = {}
    for key, delay in value.items():
        if key != "default" and key not in names:
            raise TaskError(f"{source}: termination_delay names {key!r}, which is no task of the group (give "
                            "`default` or a task's name)")
        out[str(key)] = parse_delay(delay, f"{source}: termination_delay.{key}")
    return out
