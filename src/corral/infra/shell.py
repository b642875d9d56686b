"""Bash that every backend writes the same way (pure): a task's env file, a managed job's checkpoint
folder, a file written byte for byte. Backends do not import each other; they share this."""

from __future__ import annotations

import re
import shlex

from corral.errors import TaskError
from corral.infra.base import DEFAULT_CHECKPOINT_DIR, EXIT_NOT_READY

_EXEC_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,63}\Z", re.ASCII)
_ATTEMPT_TOKEN = re.compile(r"^[0-9a-f]{12}(\.[0-9]+)?\Z", re.ASCII)
SETUP_TAIL_LINES = 15  # of a dev allocation's failed setup, what its state gives (setup_output)
IDLE_LIMIT_FILE = "idle_limit"  # in a dev allocation's run dir: its idle limit in seconds, as `corral autostop` set it
EXEC_OUTPUT = "output"  # an exec's stdout and stderr as it ran, in its folder of the allocation
EXEC_START_WAIT = 600  # seconds a follower waits for a running exec's output to begin (its files syncing)
EXEC_CANCELLED = "cancelled"  # left in the exec's folder by `corral cancel`: no step of it starts after
EXEC_ENDED = "ended"  # left in the exec's folder once it has ended, however it ended: its exit status
EXEC_SETUP_FAILED = "corral: setup failed"  # how an exec's output says its setup failed and its run did not start
GPU_CLAIMS = "gpus"  # in a dev allocation's run dir: a file per GPU slot an exec holds (its id, host, pid)
GPU_WAIT_POLL = 2  # seconds between looks while an exec waits for GPUs that other execs hold
GPU_WAITING = "corral: waiting for"  # an exec's line when it waits for GPUs other execs hold (then its reason)
GPU_TAKEN = "corral: its GPUs are free"  # and when it has them, after waiting: it starts


def exec_ended_trap(folder: str) -> str:
    """Bash: when the script ends, however it ends (TERM included), leave the exec's `ended` marker in
    `folder` (a bash word) holding its exit status: how a server that did not see the end learns it."""
    return f"trap 'echo \"$?\" > {folder}/{EXEC_ENDED}' EXIT\n"


def stop_if_cancelled(folder: str) -> str:
    """Bash: end as cancelled (143, as TERM) if `corral cancel` has left its marker in the exec's
    `folder` (a bash word): no step of the exec starts after the marker."""
    return f"if [ -e {folder}/{EXEC_CANCELLED} ]; then exit 143; fi\n"


def claim_gpus(exec_id: str, wanted: int, held: int, still_held: str) -> str:
    """Bash, `d` being the allocation's run dir: take `wanted` of its `held` GPU slots per node for
    the exec (as SkyPilot's job queue gives each job on a cluster GPUs of its own), waiting while other
    execs hold them, with a line in the exec's output when it begins to wait (GPU_WAITING) and one
    when it has them (GPU_TAKEN), which the server reads as the exec's PENDING and RUNNING. Exports
    CORRAL_GPU_SLOTS (the slots' positions, which `narrow_gpus` turns into devices on each node) and
    CORRAL_NUM_GPUS_PER_NODE.

    A slot's claim names its exec, the host and the pid of the exec's script; it is free once that
    exec has ended (its `ended` marker) or, on the same host, its script is gone. Claims are read and
    written under a lock, so two execs never take the same slot. While it waits, the exec stops if
    cancelled, and leaves EXIT_NOT_READY (75) if `still_held` (a bash command) fails: checked at
    once, then every fifth look."""
    folder = f'"$d"/{exec_folder(exec_id)}'
    claims = f'"$d"/{GPU_CLAIMS}'
    return (
        f'me=$(hostname); looks=0; exec 8>>{claims}.lock\n'
        "while :; do\n"
        "  flock 8; got=(); busy=()\n"
        f"  for slot in $(seq 0 {int(held) - 1}); do\n"
        f'    owner= host= pid=; [ -s {claims}/"$slot" ] && read -r owner host pid < {claims}/"$slot"\n'
        f'    if [ -n "$owner" ] && [ ! -e "$d/exec/$owner/{EXEC_ENDED}" ] '
        '&& { [ "$host" != "$me" ] || kill -0 "$pid" 2>/dev/null; }; then busy+=("$owner"); continue; fi\n'
        f'    got+=("$slot"); [ "${{#got[@]}}" -eq {int(wanted)} ] && break\n'
        "  done\n"
        f'  if [ "${{#got[@]}}" -eq {int(wanted)} ]; then mkdir -p {claims}; '
        f'for slot in "${{got[@]}}"; do echo "{check_exec_id(exec_id)} $me $$" > {claims}/"$slot"; done; '
        "flock -u 8; break; fi\n"
        "  flock -u 8\n"
        + "  " + stop_if_cancelled(folder)
        + f"  if [ $((looks % 5)) -eq 0 ] && ! {still_held}; then echo \"corral: the allocation ended while this job "
        f"waited for its GPUs\" >&2; exit {EXIT_NOT_READY}; fi\n"
        f'  if [ "$looks" -eq 0 ]; then mkdir -p {folder}; echo "{GPU_WAITING} {int(wanted)} of the '
        f"allocation's {int(held)} GPUs per node, in use by job(s) "
        f'$(printf "%s\\n" "${{busy[@]}}" | sort -u | paste -sd" " -)" | tee -a {folder}/{EXEC_OUTPUT}; fi\n'
        f"  looks=$((looks + 1)); sleep {GPU_WAIT_POLL}\n"
        "done\n"
        f'if [ "$looks" -gt 0 ]; then echo "{GPU_TAKEN} after $((looks * {GPU_WAIT_POLL})) s; starting" '
        f"| tee -a {folder}/{EXEC_OUTPUT}; fi\n"
        "exec 8>&-\n"
        f'export CORRAL_GPU_SLOTS=$(IFS=,; echo "${{got[*]}}") CORRAL_NUM_GPUS_PER_NODE={int(wanted)}\n'
    )


def narrow_gpus() -> str:
    """Bash, on a node of an exec's step: where the exec claimed GPU slots (CORRAL_GPU_SLOTS), keep
    only those of the devices the allocation gives the step (CUDA_VISIBLE_DEVICES, and its ROCm and
    GPU_DEVICE_ORDINAL twins where set), so that each exec sees only its own GPUs."""
    return ('if [ -n "${CORRAL_GPU_SLOTS:-}" ]; then for var in CUDA_VISIBLE_DEVICES ROCR_VISIBLE_DEVICES '
            'GPU_DEVICE_ORDINAL; do [ -n "${!var:-}" ] || continue; IFS=, read -ra all <<< "${!var}"; pick=(); '
            'for slot in ${CORRAL_GPU_SLOTS//,/ }; do pick+=("${all[$slot]}"); done; '
            'export "$var=$(IFS=,; echo "${pick[*]}")"; done; fi\n')


def leave_cancel_marker(run_dir: str, folder: str) -> str:
    """Bash: leave the cancel marker in an exec's `folder` (bash words both), if its allocation's
    `run_dir` is still there (none is made for an allocation that is gone)."""
    return f"[ -d {run_dir} ] && mkdir -p {folder} && : > {folder}/{EXEC_CANCELLED}\n"


def follow_log_until_over(poll: float) -> str:
    """Bash: print `$d/log.txt` from its start as it comes, until the caller's `over` function says the
    holder's setup is over (waiting for the log to appear; `over` asked every `poll` seconds), then the
    last half second of it."""
    return (f'while [ ! -e "$d/log.txt" ] && ! over; do sleep {poll:g}; done\n'
            '[ -e "$d/log.txt" ] || exit 0\n'
            'tail -n +1 -F -- "$d/log.txt" 2>/dev/null & t=$!\n'
            f"while ! over; do sleep {poll:g}; done\n"
            "sleep 0.5; kill $t 2>/dev/null; wait $t 2>/dev/null; exit 0\n")


def checked(pattern: re.Pattern[str], value: str, what: str) -> str:
    """`value`, which `pattern` matches, so that it may reach a command line as it is; else ValueError
    (`not <what>: <value>`): it came from somewhere it should not have, and nothing is run."""
    if not pattern.match(value):
        raise ValueError(f"not {what}: {value!r}")
    return value


def check_exec_id(exec_id: str) -> str:
    """An exec's id (its job id), checked to be a bash word needing no quotes."""
    return checked(_EXEC_ID, exec_id, "an exec id")


def check_token(token: str) -> str:
    """An attempt's token (`0123456789ab`, a rank's `0123456789ab.1`), checked to be a word needing no
    quotes."""
    return checked(_ATTEMPT_TOKEN, token, "an attempt token")


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


def remove_script(paths: list[str], flags: str) -> str:
    """`rm FLAGS` of paths under the home, each shlex-quoted (the caller checks their shape first);
    with nothing to remove, nothing is run."""
    return f'cd "$HOME" && rm {flags} -- {" ".join(map(shlex.quote, paths))}\n' if paths else "exit 0\n"


GROUPS_DIR = ".corral/groups"  # a job group's host files (CORRAL_JOBGROUP_HOSTS), one folder per group
_GROUP_ID = re.compile(r"^c-[0-9a-f]{12}\Z", re.ASCII)


def remove_group_dirs_script(group_ids: list[str]) -> str:
    """Remove each job group's folder of host files; only Corral's job ids reach the command line."""
    for group_id in group_ids:
        checked(_GROUP_ID, group_id, "a job group's id")
    return remove_script([f"{GROUPS_DIR}/{group_id}" for group_id in group_ids], "-rf")


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


class UnsafeScriptValueError(TaskError):
    """A value that would end its line in a job script (the task model refuses these first)."""


_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-/:@]*\Z", re.ASCII)
WRAPPED_RUNTIMES = ("apptainer", "singularity")  # the runtimes container_wrapper drives
CONTAINER_FILE = "container.sh"  # in a run dir: container_wrapper's script, which runs commands in the image


def check_image(image: str) -> str:
    """An OCI image reference (`ubuntu:22.04`, `nvcr.io/nvidia/pytorch:24.01-py3`), checked to be a
    word needing no quotes."""
    if not _IMAGE.match(image):
        raise UnsafeScriptValueError(f"image {image!r}: expected an image reference such as ubuntu:22.04")
    return image


def container_wrapper(runtime: str, image: str, gpus: bool) -> str:
    """`container.sh CMD…`: runs CMD in `image` with Apptainer or Singularity (`runtime`), the home (and
    so the run directory) bound at the same path, in the current directory; with `gpus`, the host's GPU
    driver too (`--nv`). Corral's own commands stay on the host: only setup and run go through it."""
    if runtime not in WRAPPED_RUNTIMES:
        raise ValueError(f"not a runtime Corral drives: {runtime!r}")
    prefix = runtime.upper()
    return ("#!/bin/bash\n"
            f"# Written by Corral: runs its arguments in the task's image with {runtime}, the home\n"
            "# (and so the run directory) bound at the same path, in the current directory. A private registry's\n"
            "# login comes from the task's SKYPILOT_DOCKER_USERNAME/PASSWORD (envs or secrets), read from env.sh\n"
            "# in a clean shell, as the runtime's own variables.\n"
            "{ IFS= read -r -d '' user; IFS= read -r -d '' password; } < <(env -i bash -c \\\n"
            """  '. "$1" >/dev/null 2>&1; printf "%s\\0%s\\0" "${SKYPILOT_DOCKER_USERNAME-}" "${SKYPILOT_DOCKER_PASSWORD-}"' \\\n"""
            '  env "$CORRAL_RUN_DIR/env.sh")\n'
            f'if [ -n "${{user:-}}" ]; then export {prefix}_DOCKER_USERNAME="$user" {prefix}_DOCKER_PASSWORD="$password"; fi\n'
            f'exec {runtime} exec{" --nv" if gpus else ""} --bind "$HOME" --pwd "$PWD" '
            f'docker://{check_image(image)} "$@"\n')
