"""Bash that every backend writes the same way (pure): a task's env file, a managed job's checkpoint
folder, a file written byte for byte. Backends do not import each other; they share this."""

from __future__ import annotations

import re
import shlex

from corral.infra.base import DEFAULT_CHECKPOINT_DIR

_EXEC_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,63}\Z", re.ASCII)
SETUP_TAIL_LINES = 15  # of a dev allocation's failed setup, what its state gives (setup_output)
IDLE_LIMIT_FILE = "idle_limit"  # in a dev allocation's run dir: its idle limit in seconds, as `corral autostop` set it
EXEC_OUTPUT = "output"  # an exec's stdout and stderr as it ran, in its folder of the allocation
EXEC_START_WAIT = 600  # seconds a follower waits for a running exec's output to begin (its files syncing)
EXEC_CANCELLED = "cancelled"  # left in the exec's folder by `corral cancel`: no step of it starts after
EXEC_ENDED = "ended"  # left in the exec's folder once it has ended, however it ended: its exit status


def exec_ended_trap(folder: str) -> str:
    """Bash: when the script ends, however it ends (TERM included), leave the exec's `ended` marker in
    `folder` (a bash word) holding its exit status: how a server that did not see the end learns it."""
    return f"trap 'echo \"$?\" > {folder}/{EXEC_ENDED}' EXIT\n"


def stop_if_cancelled(folder: str) -> str:
    """Bash: end as cancelled (143, as TERM) if `corral cancel` has left its marker in the exec's
    `folder` (a bash word): no step of the exec starts after the marker."""
    return f"if [ -e {folder}/{EXEC_CANCELLED} ]; then exit 143; fi\n"


def leave_cancel_marker(run_dir: str, folder: str) -> str:
    """Bash: leave the cancel marker in an exec's `folder` (bash words both), if its allocation's
    `run_dir` is still there (none is made for an allocation that is gone)."""
    return f"[ -d {run_dir} ] && mkdir -p {folder} && : > {folder}/{EXEC_CANCELLED}\n"


def check_exec_id(exec_id: str) -> str:
    """An exec's id (its job id), checked to be a bash word needing no quotes."""
    if not _EXEC_ID.match(exec_id):
        raise ValueError(f"not an exec id: {exec_id!r}")
    return exec_id


def exec_folder(exec_id: str) -> str:
    """An exec's folder in its allocation's run dir (a bash word needing no quotes): its files, the
    output it showed, and the marker that it has ended."""
    return f"exec/{check_exec_id(exec_id)}"


def render_env(envs: dict[str, str]) -> str:
    """env.sh: each value quoted with shlex.quote, so that it arrives byte for byte."""
    return "".join(f"export {key}={shlex.quote(value)}\n" for key, value in envs.items())


def checkpoint_lines(path: str, task_id: str) -> list[str]:
    """Export CORRAL_CHECKPOINT_DIR and create it. `path`: relative to the home unless absolute, or
    DEFAULT_CHECKPOINT_DIR (~/.corral/checkpoints/<job id>); `task_id`: the job id as a bash word."""
    if path == DEFAULT_CHECKPOINT_DIR:
        where = f'"$HOME"/.corral/checkpoints/{task_id}'
    else:
        where = shlex.quote(path) if path.startswith("/") else f'"$HOME"/{shlex.quote(path)}'
    return [f"export CORRAL_CHECKPOINT_DIR={where}", 'mkdir -p "$CORRAL_CHECKPOINT_DIR"']


def write_file(target: str, content: str) -> str:
    """Bash writing `content` exactly to `target` (a bash word): bash's own printf with the content
    shell-quoted, so no process is started for it (a `cat` heredoc per file cost ~1.5 ms each on the
    testbed: 9 ms of a 28 ms submission)."""
    return f"printf '%s' {shlex.quote(content)} > {target}"


def tail_lines(tail: int) -> str:
    """tail(1)'s line option for a log: its last `tail` lines, or (0) all of it."""
    return f"-n {int(tail)}" if tail > 0 else "-n +1"


def one_line_word(text: str) -> str:
    """`text` as one bash word on one line, with no `!` in it: bash's `$'…'` with the newline, `!`,
    quotes, backslashes and other control characters escaped; for a command line that a csh-family
    login shell reads first (it takes `!` as history even between single quotes)."""
    escaped = "".join(
        "\\\\" if c == "\\" else "\\'" if c == "'" else "\\n" if c == "\n" else
        f"\\x{ord(c):02x}" if c == "!" or ord(c) < 0x20 or ord(c) == 0x7F else c
        for c in text)
    return f"$'{escaped}'"
