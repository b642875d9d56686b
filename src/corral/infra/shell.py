"""Bash that every backend writes the same way (pure): a task's env file, a managed job's checkpoint
folder, a file written byte for byte. Backends do not import each other; they share this."""

from __future__ import annotations

import secrets
import shlex

from corral.infra.base import DEFAULT_CHECKPOINT_DIR


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


def heredoc(target: str, content: str) -> str:
    """Bash writing `content` exactly to `target` (a bash word): a quoted heredoc whose delimiter the
    content does not hold; a file without a final newline gets none."""
    delimiter = "CORRAL_EOF_" + secrets.token_hex(8)
    while delimiter in content:
        delimiter = "CORRAL_EOF_" + secrets.token_hex(8)
    if content and not content.endswith("\n"):
        # A heredoc always ends with a newline; strip it again so the file is byte-exact.
        return f"head -c -1 > {target} <<'{delimiter}'\n{content}\n{delimiter}"
    return f"cat > {target} <<'{delimiter}'\n{content}{delimiter}"
