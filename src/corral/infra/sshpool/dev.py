"""Dev allocations on a pool's machines, as bash Corral sends over ssh (pure).

The holder is a task like any other on its machine (`runner.holder_script`): it claims the GPUs, runs
setup, writes `vars.sh` (Corral's variables and `CUDA_VISIBLE_DEVICES`), marks itself `ready`, and
holds until `corral down` leaves the cancel marker or nothing has run in it for the idle limit. Each
exec and each `corral ssh` session keeps `last_active` fresh while it runs, so the holder itself can
tell when the allocation is idle, with no server up.
"""

from __future__ import annotations

import shlex

from corral.infra.base import EXIT_NOT_READY
from corral.infra.shell import (
    CONTAINER_FILE,
    EXEC_ENDED,
    EXEC_OUTPUT,
    EXEC_SETUP_FAILED,
    EXEC_START_WAIT,
    IDLE_LIMIT_FILE,
    SETUP_TAIL_LINES,
    check_token,
    claim_gpus,
    exec_ended_trap,
    exec_folder,
    follow_log_until_over,
    leave_cancel_marker,
    narrow_gpus,
    render_env,
    stop_if_cancelled,
    tail_lines,
    write_file,
)
from corral.infra.sshpool.inventory import ALIVE, MARK
from corral.infra.sshpool.runner import END_PROCS, EXEC_GROUPS, RUNS_DIR, SESSION_PROCS, run_dir_word

_KEEP_ACTIVE = ('( while kill -0 "$$" 2>/dev/null; do touch "$d/last_active"; sleep 5; done ) '
                "</dev/null >/dev/null 2>&1 &\n")


def _ready_check(token: str) -> str:
    """Bash: `d` is the holder's run dir; exit EXIT_NOT_READY unless the holder lives and is ready."""
    return (f"d={run_dir_word(token)}\n" + ALIVE
            + 'pid= since=; [ -s "$d/pid" ] && read -r pid since < "$d/pid"\n'
            + 'if ! alive "$pid" "$since" || [ ! -e "$d/ready" ]; then '
            + f'echo "corral: the allocation is not ready on $(hostname)" >&2; exit {EXIT_NOT_READY}; fi\n')


def _exec_dir(token: str, exec_id: str) -> str:
    """An exec's folder on the machine of rank `token`, as a bash word."""
    return f"{run_dir_word(token)}/{exec_folder(exec_id)}"


# Bash (in the run dir `d`, its vars.sh sourced): `inside` is the bash that runs the allocation's
# commands, in its image where the holder has one (the run dir's container.sh, as for its setup).
_INSIDE = (f'inside=("$BASH"); [ -f "$d/{CONTAINER_FILE}" ] && inside=("$BASH" "$d/{CONTAINER_FILE}" bash)\n')

CLAIMED = "corral: claimed its GPUs; waiting for the go"  # a multi-machine exec's line, on stdout only


def exec_script(token: str, exec_id: str, envs: dict[str, str], run: str, setup: str = "", gpus_claimed: int = 0,
                gpus_held: int = 0, wait_for_go: bool = False) -> str:
    """Run `run` in the allocation's rank on this machine, with its variables and GPUs; its exit status.
    With `setup`, that first, and `run` only if it succeeded. Their stdout and stderr, merged, go to
    the caller and to the exec's `output` file; the exec's `pid` (this script's, with its start time)
    lets `cancel_exec_script` end it; `ended` is left however it ends.

    With `gpus_claimed`, it first takes that many of the `gpus_held` GPUs the allocation holds on this
    machine (`claim_gpus`: waiting while other execs hold them) and sees only those. `wait_for_go` (an
    exec on several machines, which claims them one at a time in rank order so that two such execs
    never each hold a machine the other waits for): once it has them, it says CLAIMED on stdout and
    waits for the `go` file `go_script` leaves, so that every rank starts together."""
    folder = f'"$d"/{exec_folder(exec_id)}'
    claim = ""
    if gpus_claimed:
        holder_lives = '{ read -r hp hs < "$d/pid" && alive "$hp" "$hs"; }'
        claim = claim_gpus(exec_id, gpus_claimed, gpus_held, holder_lives)
        if wait_for_go:
            claim += (f'echo "{CLAIMED}"\n'
                      f'until [ -e {folder}/go ]; do {stop_if_cancelled(folder).strip()}; '
                      f'{holder_lives} || exit {EXIT_NOT_READY}; sleep 0.2; done\n')

    def step(command_file: str, tee_flags: str) -> str:
        return (f'"${{inside[@]}}" -c \'. "$1" || exit 1; shift; exec "$BASH" "$@"\' task-env {folder}/env.sh '
                f"{folder}/{command_file} </dev/null 2>&1 | tee -p {tee_flags}{folder}/{EXEC_OUTPUT}\n")

    script = (_ready_check(token)
              + f"mkdir -p {folder}\n"
              + write_file(f"{folder}/run.sh", run) + "\n"
              + (write_file(f"{folder}/setup.sh", setup) + "\n" if setup else "")
              + write_file(f"{folder}/env.sh", render_env(envs)) + "\n"
              + f'echo "$$ $(started "$$")" > {folder}/pid\n'
              + exec_ended_trap(folder)
              # After `pid`, as `cancel_exec_script` reads `pid` after its marker: one sees the other.
              + stop_if_cancelled(folder)
              + claim
              + _KEEP_ACTIVE
              + '. "$d/vars.sh"; export CORRAL_TASK_ID=' + shlex.quote(exec_id) + "\n"
              + (narrow_gpus() + f"export CORRAL_NUM_GPUS_PER_NODE={int(gpus_claimed)}\n" if gpus_claimed else "")
              + 'cd "$d/workdir" || exit 1\n'
              + _INSIDE)
    if setup:
        script += (step("setup.sh", "-a " if gpus_claimed else "")  # after the lines it waited with
                   + 'status=${PIPESTATUS[0]}\n'
                   + stop_if_cancelled(folder)
                   + f'if [ "$status" -ne 0 ]; then echo "{EXEC_SETUP_FAILED} on $(hostname) with exit code $status; '
                   + f'the run did not start" | tee -a {folder}/{EXEC_OUTPUT}; exit "$status"; fi\n')
        if not run:
            return script + "exit 0\n"
    return script + step("run.sh", "-a " if setup or gpus_claimed else "") + 'exit "${PIPESTATUS[0]}"\n'


def go_script(token: str, exec_id: str) -> str:
    """Let a multi-machine exec's rank on this machine start (`exec_script`'s `wait_for_go`)."""
    return f": > {_exec_dir(token, exec_id)}/go\n"


def idle_limit_script(token: str, idle_seconds: int) -> str:
    """Give this machine's holder of the allocation a new idle limit (0: never), counted from now."""
    folder = run_dir_word(token)
    return (f"[ -d {folder} ] || exit 0\n"
            f'echo {int(idle_seconds)} > {folder}/{IDLE_LIMIT_FILE}.new && mv -f {folder}/{IDLE_LIMIT_FILE}.new '
            f"{folder}/{IDLE_LIMIT_FILE} && touch {folder}/last_active\n")


def exec_output_script(token: str, exec_id: str, follow: bool, tail: int = 0) -> str:
    """Print what an exec showed on this machine (with `tail` > 0, its last `tail` lines); with
    `follow`, until it has ended (its `ended` marker, or its process gone)."""
    folder = _exec_dir(token, exec_id)
    lines = tail_lines(tail)
    if not follow:
        return f"tail {lines} -- {folder}/{EXEC_OUTPUT} 2>/dev/null; exit 0\n"
    return (ALIVE + f"e={folder}\n"
            + f'running() {{ [ ! -e "$e/{EXEC_ENDED}" ] && read -r pid since < "$e/pid" 2>/dev/null '
            + '&& alive "$pid" "$since"; }\n'
            + f'n=0; while [ ! -e "$e/{EXEC_OUTPUT}" ] && [ ! -e "$e/{EXEC_ENDED}" ] && [ "$n" -lt {EXEC_START_WAIT} ]; '
            + 'do n=$((n + 1)); sleep 1; done\n'
            + f'[ -e "$e/{EXEC_OUTPUT}" ] || exit 0\n'
            + f'tail {lines} -F -- "$e/{EXEC_OUTPUT}" 2>/dev/null & t=$!\n'
            + "while running; do sleep 1; done\n"
            + "sleep 1; kill $t 2>/dev/null; wait $t 2>/dev/null; exit 0\n")


def cancel_exec_script(token: str, exec_id: str) -> str:
    """End a running exec on this machine: TERM the process group of its ssh session (the exec's
    script, its command, their children), not the holder; KILL what is left 10 s later. Its marker
    first: an exec that has not yet written its `pid` ends as soon as it has."""
    folder = _exec_dir(token, exec_id)
    return (ALIVE + EXEC_GROUPS + f"e={folder}\n"
            + leave_cancel_marker(run_dir_word(token), '"$e"')
            + f'[ -e "$e/{EXEC_ENDED}" ] && exit 0\n'
            + 'group=$(exec_group "$e") || exit 0\n'
            + 'read -r pid since < "$e/pid"\n'
            + 'kill -TERM -- "-$group" 2>/dev/null\n'
            + '( sleep 10; alive "$pid" "$since" && kill -KILL -- "-$group" 2>/dev/null ) '
            + "</dev/null >/dev/null 2>&1 &\nexit 0\n")


def shell_command(token: str, command: str | None) -> str:
    """The remote command of `corral ssh`: a login shell (or `command`) in the allocation's workdir,
    with its variables and GPUs, in its image where it has one, keeping it active while it runs."""
    script = (_ready_check(token) + _KEEP_ACTIVE
              # the holder's walltime and `corral down` end the session (runner.SESSION_PROCS)
              + 'mkdir -p "$d/sessions" && echo "$$ $(started "$$")" > "$d/sessions/$$"\n'
              + '. "$d/vars.sh"; cd "$d/workdir" || exit 1\n' + _INSIDE
              + ('"${inside[@]}" -l\n' if command is None else f'"${{inside[@]}}" -lc {shlex.quote(command)}\n'))
    return f"bash -c {shlex.quote(script)}"


SETUP_SAID = f"{MARK} said"  # states_script's lines of a failed setup's output: `@@corral said <token> <line>`


def setup_output_script(token: str) -> str:
    """Print the holder's log from its start as it comes (its setup's output), until it is ready, its
    setup failed, or it has ended (its exit code written, or its process gone)."""
    d = run_dir_word(token)
    return (f"{ALIVE}d={d}\n"
            'over() { [ -e "$d/ready" ] || [ -e "$d/setup_failed" ] || [ -e "$d/exit_code" ] && return 0; '
            '[ -s "$d/pid" ] || return 1; read -r p s < "$d/pid" || return 1; ! alive "$p" "$s"; }\n'
            + follow_log_until_over(0.5))


def states_script(tokens: list[str]) -> str:
    """One line per token: `<token> <alive 0|1> <ready 0|1> <last active or -> <setup exit code or -> <ended
    reason or -> <ended execs as id:status,… or -> <walltime's end (epoch) or ->`; after a failed setup's,
    its last lines in the holder's log, each as `@@corral said <token> <line>`."""
    body = " ".join(check_token(t) for t in tokens)
    return (ALIVE + f"printf '{MARK} clock %s\\n' \"$(date +%s)\"\n"
            + f"for t in {body}; do\n"
            + f'  d="$HOME/{RUNS_DIR}/$t"; pid= since=; [ -s "$d/pid" ] && read -r pid since < "$d/pid"\n'
            + '  if alive "$pid" "$since"; then a=1; else a=0; fi\n'
            + '  if [ -e "$d/ready" ]; then r=1; else r=0; fi\n'
            + '  l=$(stat -c %Y "$d/last_active" 2>/dev/null || echo -)\n'
            + '  s=$(head -c 12 "$d/setup_failed" 2>/dev/null || echo -)\n'
            + '  e=$( { [ -e "$d/cancelled" ] && echo down; } || head -c 12 "$d/ended" 2>/dev/null '
            + '|| { [ -e "$d/timed_out" ] && echo walltime; } || echo -)\n'
            + '  w=$(head -c 12 "$d/deadline" 2>/dev/null | tr -dc 0-9)\n'
            + f'  x=; for f in "$d"/exec/*/{EXEC_ENDED}; do [ -s "$f" ] || continue; g=${{f%/*}}; '
            + 'x="$x${g##*/}:$(head -c 12 "$f" | tr -dc 0-9),"; done\n'
            + '  echo "$t $a $r $l ${s:--} ${e:--} ${x:--} ${w:--}"\n'
            + f'  [ "${{s:--}}" = - ] || tail -n {SETUP_TAIL_LINES} "$d/log.txt" 2>/dev/null | cut -c1-300 | '
            + f'sed "s/^/{SETUP_SAID} $t /"\n'
            + "done\nexit 0\n")


def release_script(tokens: list[str]) -> str:
    """Leave each holder's cancel marker, end its process group, the execs still running in it and its
    ssh sessions (runner.END_PROCS: TERM, KILL 10 s later to what is left, in the background: the GPUs
    the holder frees must not stay in use), and remove its run dir: now, and once more when they have
    ended, since an exec's trap may write its `ended` there while the first removal runs (and so
    leave the folder behind)."""
    body = " ".join(check_token(t) for t in tokens)
    return (ALIVE + EXEC_GROUPS + SESSION_PROCS + END_PROCS + f"for t in {body}; do\n"
            + f'  d="$HOME/{RUNS_DIR}/$t"; [ -d "$d" ] || continue\n'
            + '  : > "$d/cancelled"; pid= since=; [ -s "$d/pid" ] && read -r pid since < "$d/pid"\n'
            + '  groups=(); alive "$pid" "$since" && groups=("-$pid")\n'
            + '  for g in $(exec_groups "$d"); do groups+=("-$g"); done\n'
            + '  sessions=$(session_procs "$d")\n'
            + '  ( end_procs 10 "$sessions" "${groups[@]}"; rm -rf "$d" ) </dev/null >/dev/null 2>&1 &\n'
            + '  rm -rf "$d" 2>/dev/null\n'
            + "done\nexit 0\n")
