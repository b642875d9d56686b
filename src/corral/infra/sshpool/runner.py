"""What runs on a pool's machine, as bash Corral sends over ssh (pure: golden-tested, run on the testbed).

A task on a machine is a process group of its own (`setsid`), started from its run directory
`~/.corral/runs/<token>/`, which holds:
- `job.sh`: Corral's variables, then `setup.sh` and `run.sh` with the task's env (`env.sh`, sourced only
  by the bash that runs them), in `workdir/`; it writes `exit_code` when run ends (`setup_failed` too
  when setup fails);
- `pid`: the group's leader and its start time (`inventory.ALIVE`), written once it started;
  `log.txt`: its output;
- `cancelled`: left before Corral kills the group, so that a task that had not started yet never does;
- `deadline` (epoch) when the task has a walltime, and `timed_out` once its watchdog ended it (WATCHDOG);
  `out_of_memory` (`<used MB> <limit MB>`) once it ended it for using more memory than it asked for.

- `wants` (`<gpus> <cpus> <type>`), `memory` (MB, when it asks some), `host` (the machine that took
  it: homes may be shared), and `queued` while it waits in the machine's queue.

GPUs, CPUs and memory are claimed under `flock` on `~/.corral/pool/<hostname>/lock`, by the functions of
claims.py: a claim counts while its task's process lives. The claim and the start are one step under
the lock, so two launches never take the same GPU, and a retried submission finds the task it started
(its `pid`) or queued instead of starting it twice. Nothing is installed: bash, coreutils, flock
(util-linux) and, where there are GPUs, nvidia-smi.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from corral.infra.base import JobRequest
from corral.infra.shell import (
    CONTAINER_FILE,
    GROUPS_DIR,
    IDLE_LIMIT_FILE,
    check_token,
    checkpoint_lines,
    remove_script,
    tail_lines,
    write_file,
)
from corral.infra.sshpool import claims
from corral.infra.sshpool.inventory import ALIVE, MARK, POOL_DIR

RUNS_DIR = claims.RUNS_DIR
# Bash (after ALIVE): `exec_group FOLDER` prints the process group of the exec in that folder while it
# runs (its ssh session's: the exec's script, its command, their children), and fails otherwise or when
# it is this script's own; `exec_groups RUN_DIR` prints those of every exec running in an allocation.
EXEC_GROUPS = ('exec_group() {\n'
               '  local xp xs g; read -r xp xs < "$1/pid" 2>/dev/null && alive "$xp" "$xs" || return 1\n'
               '  g=$(ps -o pgid= -p "$xp" | tr -d " ")\n'
               '  [ -n "$g" ] && [ "$g" != "$(ps -o pgid= -p $$ | tr -d " ")" ] && echo "$g"\n'
               '}\n'
               'exec_groups() { local f; for f in "$1"/exec/*/; do exec_group "$f"; done; return 0; }\n')
# Bash (after ALIVE): `session_procs RUN_DIR` prints `<pid> <start>` for each process of the live `corral
# ssh` sessions in an allocation (each leaves `sessions/<pid>`: see dev.shell_command), their leaders and
# every descendant: an interactive shell puts each job in a process group of its own, and ignores TERM.
# `signal_procs SIGNAL` sends SIGNAL to those listed on stdin that still live, and fails when none does.
SESSION_PROCS = ('session_procs() {\n'
                 '  local f sp ss all list frontier next p pp\n'
                 '  all=$(ps -e -o pid=,ppid=)\n'
                 '  for f in "$1"/sessions/*; do\n'
                 '    read -r sp ss < "$f" 2>/dev/null && alive "$sp" "$ss" || continue\n'
                 '    list=" $sp "; frontier=" $sp "\n'
                 '    while [ -n "${frontier// }" ]; do\n'
                 '      next=" "\n'
                 '      while read -r p pp; do case "$frontier" in *" $pp "*) case "$list" in *" $p "*) ;; '
                 '*) list="$list$p "; next="$next$p ";; esac;; esac; done <<< "$all"\n'
                 '      frontier=$next\n'
                 '    done\n'
                 '    for p in $list; do [ "$p" = "$$" ] || echo "$p $(started "$p")"; done\n'
                 '  done\n'
                 '}\n'
                 'signal_procs() {\n'
                 '  local p s any=1\n'
                 '  while read -r p s; do alive "$p" "$s" && kill -"$1" "$p" 2>/dev/null && any=0; done\n'
                 '  return "$any"\n'
                 '}\n')
# Bash (after SESSION_PROCS): `end_procs WAIT PROCS -GROUP...` ends what a task or an allocation runs, as
# Slurm ends a job's steps: TERM to each process group and to each process PROCS lists (session_procs'
# lines), then KILL to what is left once WAIT seconds have passed (it returns as soon as all are gone).
END_PROCS = ('end_procs() {\n'
             '  local wait=$1 procs=$2 g live; shift 2\n'
             '  [ $# -gt 0 ] && kill -TERM -- "$@" 2>/dev/null; signal_procs TERM <<< "$procs"\n'
             '  for _ in $(seq "$wait"); do\n'
             '    live=0; for g in "$@"; do kill -0 -- "$g" 2>/dev/null && live=1; done\n'
             '    signal_procs 0 <<< "$procs" && live=1\n'
             '    [ "$live" = 0 ] && return 0; sleep 1\n'
             '  done\n'
             '  [ $# -gt 0 ] && kill -KILL -- "$@" 2>/dev/null; signal_procs KILL <<< "$procs"; return 0\n'
             '}\n')


def _release(token: str) -> str:
    """Bash: free what the task of `token` (a bash word) holds and start what then fits in the queue."""
    return (f'  local base="$HOME/{POOL_DIR}/${{HOSTNAME:-$(hostname)}}"\n'
            f'  [ -f "$base/{claims.LIBRARY}" ] || return 0\n'
            f'  ( exec 9>"$base/lock"; flock -w 60 9 || exit 0; . "$base/{claims.LIBRARY}" '
            f'&& release {token} && drain ) </dev/null >/dev/null 2>&1\n')


# What a task frees when it ends (not when cancelled: cancel_script starts the queue once it has killed
# what was left) goes at once to the machine's queue (claims.py).
END_TRAP = ("corral_end() {\n"
            '  [ -e "$CORRAL_RUN_DIR/cancelled" ] && return 0\n'
            + _release('"${CORRAL_RUN_DIR##*/}"') +
            "}\n"
            "trap corral_end EXIT")
# The task's watchdog, in a session of its own (a cancel's kill of the task's group leaves it; it ends
# within 10 s of the task), for a walltime or a memory limit (`$3` = memory: a task's, not a holder's).
# At the task's `deadline` it leaves `timed_out`; when the task's processes use more memory (RSS) than
# it asked for, `out_of_memory` (`<used MB> <limit MB>`), as Slurm's OverMemoryKill does from its
# accounting polls. Either way it says so in the log and ends the task's group, and a dev allocation's
# execs and ssh sessions, as Slurm ends a job's steps (TERM, then KILL after KILL_WAIT_SECONDS to what is
# left). $1: the task's leader, $2 its run dir.
KILL_WAIT_SECONDS = 30  # Slurm's default KillWait
WATCH_SECONDS = 10  # how often it looks (Slurm's JobAcctGatherFrequency is 30 s)
WATCHDOG = (ALIVE + EXEC_GROUPS + SESSION_PROCS + END_PROCS
            + 'd=$2 pid=$1; since=$(started "$pid")\n'
            'deadline=; [ -s "$d/deadline" ] && read -r deadline < "$d/deadline"\n'
            'limit=0; [ "${3:-}" = memory ] && [ -s "$d/memory" ] && read -r limit < "$d/memory"\n'
            '[ -n "$deadline" ] || [ "$limit" -gt 0 ] || exit 0\n'
            'end_task() {  # $1: the mark to leave, $2 what it holds, $3 why, for the log\n'
            '  [ -e "$d/cancelled" ] && exit 0\n'
            '  echo "$2" > "$d/$1"\n'
            '  echo "corral: *** $3 on ${HOSTNAME:-$(hostname)}: ending it ***" >> "$d/log.txt"\n'
            '  groups=("-$pid"); for g in $(exec_groups "$d"); do groups+=("-$g"); done\n'
            f'  end_procs {KILL_WAIT_SECONDS} "$(session_procs "$d")" "${{groups[@]}}"\n'
            '  corral_end() {\n' + _release('"${d##*/}"') + '}; corral_end; exit 0\n'
            '}\n'
            'used_mb() {  # the resident memory of the task\'s process group, in MB\n'
            '  local g r kb=0\n'
            '  while read -r g r; do [ "$g" = "$pid" ] && kb=$((kb + r)); done < <(ps -e -o pgid=,rss=)\n'
            '  echo $((kb / 1024))\n'
            '}\n'
            'while alive "$pid" "$since"; do\n'
            "  printf -v now '%(%s)T' -1; wait=" + str(WATCH_SECONDS) + "\n"
            '  if [ -n "$deadline" ]; then\n'
            '    left=$(( deadline - now ))\n'
            '    [ "$left" -le 0 ] && end_task timed_out "$now" "the task reached its time limit"\n'
            '    [ "$left" -lt "$wait" ] && wait=$left\n'
            '  fi\n'
            '  if [ "$limit" -gt 0 ]; then\n'
            '    used=$(used_mb)\n'
            '    [ "$used" -gt "$limit" ] && end_task out_of_memory "$used $limit" '
            '"the task used $used MB of memory, more than the $limit MB it asked for"\n'
            '  fi\n'
            '  sleep "$wait"\n'
            "done\n")
MOUNTS_STAGE = "mounts"  # in a run dir: file mounts kept apart until the workdir is copied from its cache


def run_dir(token: str) -> str:
    return f"{RUNS_DIR}/{check_token(token)}"


def run_dir_word(token: str) -> str:
    """The run directory of rank `token` on its machine, as a bash word."""
    return f'"$HOME"/{shlex.quote(run_dir(token))}'


def job_script(request: JobRequest, pool: str, rank: int = 0, node_addresses: Sequence[str] = ()) -> str:
    """job.sh: the task on one machine, as node `rank` of the request's nodes. `node_addresses`: every
    node's, rank 0 first (a single node finds its own)."""
    lines = _prologue(request, pool, rank, node_addresses, "the task", in_image=bool(request.container_image),
                      watch_memory=True)
    lines += [
        'with_env "$CORRAL_RUN_DIR/run.sh"; rc=$?',
        'echo "$rc" > "$CORRAL_RUN_DIR/exit_code.new" && mv "$CORRAL_RUN_DIR/exit_code.new" "$CORRAL_RUN_DIR/exit_code"',
        'exit "$rc"',
    ]
    return "\n".join(lines) + "\n"


def holder_script(request: JobRequest, pool: str, rank: int, node_addresses: Sequence[str], idle_seconds: int) -> str:
    """job.sh of a dev allocation: setup, then hold the machine's claimed GPUs until `corral down` (the
    cancel marker), or until nothing has run in it (`last_active`, kept fresh by each exec and ssh
    session) for `idle_seconds` (0: never). `vars.sh` keeps Corral's variables and the GPUs for them."""
    lines = _prologue(request, pool, rank, node_addresses, "a dev allocation's holder",
                      in_image=bool(request.container_image))
    lines += [
        "export -p | grep -E '^declare -x (CORRAL_|SKYPILOT_|CUDA_VISIBLE_DEVICES=)' > \"$CORRAL_RUN_DIR/vars.sh\"",
        'date +%s > "$CORRAL_RUN_DIR/last_active"',
        ': > "$CORRAL_RUN_DIR/ready"',
        f"idle_limit={int(idle_seconds)}",
        "while true; do",
        f'  [ -s "$CORRAL_RUN_DIR/{IDLE_LIMIT_FILE}" ] && read -r idle_limit < "$CORRAL_RUN_DIR/{IDLE_LIMIT_FILE}"',
        '  poll=5; if [ "$idle_limit" -gt 0 ] && [ "$idle_limit" -lt 15 ]; then poll=1; fi',
        '  sleep "$poll"',
        '  if [ -e "$CORRAL_RUN_DIR/cancelled" ] || [ ! -d "$CORRAL_RUN_DIR" ]; then exit 0; fi',
        '  active=$(stat -c %Y "$CORRAL_RUN_DIR/last_active" 2>/dev/null || echo 0)',
        '  if [ "$idle_limit" -gt 0 ] && [ $(( $(date +%s) - active )) -ge "$idle_limit" ]; then',
        '    echo "corral: idle for ${idle_limit}s: releasing the allocation"; echo idle > "$CORRAL_RUN_DIR/ended"',
        '    echo 0 > "$CORRAL_RUN_DIR/exit_code"; exit 0',
        "  fi",
        "done",
    ]
    return "\n".join(lines) + "\n"


def _prologue(request: JobRequest, pool: str, rank: int, node_addresses: Sequence[str], what: str,
              in_image: bool = False, watch_memory: bool = False) -> list[str]:
    """Corral's variables, the workdir, the cancel fence and setup (its failure recorded), as bash lines.
    `in_image`: setup and run go through the run dir's `container.sh` (CONTAINER_FILE), with the
    image's bash; Corral's own commands stay on the host. `watch_memory`: the watchdog ends the task
    if it uses more memory than it asked for (a holder's is not watched: see docs/pools.md)."""
    nodes = str(request.num_nodes)
    variables = {
        "CORRAL_TASK_ID": request.task_ids[0], "SKYPILOT_TASK_ID": request.task_ids[0],
        "CORRAL_CLUSTER": pool, "CORRAL_JOB_RANK": str(request.first_rank), "CORRAL_NUM_JOBS": str(request.num_jobs),
        "CORRAL_NODE_RANK": str(rank), "SKYPILOT_NODE_RANK": str(rank), "CORRAL_NUM_NODES": nodes,
        "SKYPILOT_NUM_NODES": nodes, "CORRAL_NUM_GPUS_PER_NODE": str(request.accelerators_per_node),
        "SKYPILOT_NUM_GPUS_PER_NODE": str(request.accelerators_per_node), **request.extra_env,
    }
    lines = ["#!/bin/bash", f"# Written by Corral: {what} on this machine (rank {rank} of {nodes}).", "set -u",
             'export CORRAL_RUN_DIR="$(cd "$(dirname "$0")" && pwd)"', END_TRAP]
    if node_addresses:
        listed = shlex.quote("\n".join(node_addresses))
        lines.append(f"export CORRAL_NODE_IPS={listed} SKYPILOT_NODE_IPS={listed}")
    else:
        lines += ['ip=$(hostname -I 2>/dev/null | awk "{print \\$1}")',
                  'export CORRAL_NODE_IPS="${ip:-$(hostname)}" SKYPILOT_NODE_IPS="${ip:-$(hostname)}"']
    lines += [f"export {key}={shlex.quote(value)}" for key, value in sorted(variables.items())]
    if request.checkpoint_dir:
        lines += checkpoint_lines(request.checkpoint_dir, shlex.quote(request.task_ids[0]))
    if "CORRAL_JOBGROUP_TASK" in request.extra_env and "CORRAL_PIPELINE_ID" in request.extra_env:
        # As on Slurm (jobscript.TASK_SH): this rank's address, for the group's other tasks, in the
        # folder of the group's round, in the home the pool's machines share (HostsJobGroups).
        lines += [
            f'export CORRAL_JOBGROUP_HOSTS="$HOME/{GROUPS_DIR}/$CORRAL_PIPELINE_ID'
            '${CORRAL_JOBGROUP_ROUND:+/$CORRAL_JOBGROUP_ROUND}"',
            'host_file="$CORRAL_JOBGROUP_HOSTS/$CORRAL_JOBGROUP_TASK-$CORRAL_NODE_RANK"',
            'mkdir -p "$CORRAL_JOBGROUP_HOSTS" && sed -n "$((CORRAL_NODE_RANK + 1))p" <<< "$CORRAL_NODE_IPS" '
            '> "$host_file.$$" && mv -f "$host_file.$$" "$host_file"',
        ]
    lines += [
        'cd "$CORRAL_RUN_DIR/workdir" || exit 1',
        'if [ -e "$CORRAL_RUN_DIR/cancelled" ]; then echo "corral: cancelled before it started"; exit 143; fi',
    ]
    inside = f'"$BASH" "$CORRAL_RUN_DIR/{CONTAINER_FILE}" bash' if in_image else '"$BASH"'
    if request.time_limit_seconds:  # counted from here, setup included, as Slurm counts a job's
        lines.append(f"printf -v corral_now '%(%s)T' -1; echo $(( corral_now + {int(request.time_limit_seconds)} )) "
                     '> "$CORRAL_RUN_DIR/deadline"')
    watch_memory = watch_memory and bool(request.memory_mb)
    if request.time_limit_seconds or watch_memory:
        lines.append(f'setsid "$BASH" -c {shlex.quote(WATCHDOG)} corral-watchdog "$$" "$CORRAL_RUN_DIR" '
                     f'{"memory" if watch_memory else "-"} </dev/null >/dev/null 2>&1 &')
    return lines + [
        f'with_env() {{ {inside} -c \'. "$1" || exit 1; shift; exec "$BASH" "$@"\' task-env "$CORRAL_RUN_DIR/env.sh" "$@"; }}',
        'if [ -s "$CORRAL_RUN_DIR/setup.sh" ]; then',
        '  with_env "$CORRAL_RUN_DIR/setup.sh"; rc=$?',
        '  if [ "$rc" -ne 0 ]; then',
        '    echo "corral: setup failed on $(hostname) with exit code $rc" >&2',
        '    echo "$rc" > "$CORRAL_RUN_DIR/setup_failed"; echo "$rc" > "$CORRAL_RUN_DIR/exit_code"; exit "$rc"',
        "  fi",
        "fi",
    ]


def submit_script(request: JobRequest, pool: str, files: dict[str, str], configured: Sequence[str] = (),
                  workdir_cache: str | None = None, may_queue: bool = False) -> str:
    """Start the task when its GPUs (of its type), CPUs and memory are free, in one round trip; idempotent by
    token. With `may_queue`, a task that must wait joins the machine's queue (claims.py) and starts as
    soon as what it wants is free and nothing queued before it waits for the same. Answers `@@corral
    submitted <host>/<token> new|queued|existing`, or `@@corral rejected <why>`. The files (env.sh holds
    the task's secrets) are written under the machine's lock once the token is known not to be there;
    a rejected start leaves no run directory behind (nor the workdir synced into it).
    `workdir_cache` (under the home): the workdir's cache on this machine, hard-linked into a fresh
    `workdir/`; what file_mounts put in `MOUNTS_STAGE/` then goes over it (new files, never written
    into the cache's), as file mounts follow the workdir on every infra."""
    token = check_token(request.token)
    directory = run_dir_word(token)
    copy = ""
    if workdir_cache is not None:
        source = f'"$HOME"/{shlex.quote(workdir_cache)}/.'
        copy = (f'rm -rf "$d/workdir" && mkdir -p "$d/workdir" || exit 1\n'
                f'{{ cp -al {source} "$d/workdir"/ 2>/dev/null || cp -a {source} "$d/workdir"/; }} '
                '|| reject "could not copy the workdir from its cache"\n'
                f'if [ -d "$d/{MOUNTS_STAGE}" ]; then\n'
                f'  {{ cp -a --remove-destination "$d/{MOUNTS_STAGE}/." "$d/workdir"/ && rm -rf "$d/{MOUNTS_STAGE}"; }} '
                '|| reject "could not place the file mounts in the workdir"\nfi\n')
    gpus = request.accelerators_per_node
    cpus = claims.cpus_wanted(request.cpus_per_node, gpus)
    kind = shlex.quote(request.accelerator_type or "")
    memory = max(0, request.memory_mb or 0)
    writes = "".join(write_file(f'"$d"/{shlex.quote(name)}', content) + "\n" for name, content in files.items())
    waits = (f'echo "{MARK} submitted $host/{token} queued"; exit 0' if may_queue else
             f'rm -f -- "$base/queue/"*"_{token}" "$d/queued"\n'
             'fits "$d" && reject "$host has tasks queued before it"\n'
             f'[ "${{#free[@]}}" -lt {gpus} ] && '
             f'reject "$host has ${{#free[@]}} free GPU(s) of the kind asked, not {gpus}"\n'
             f'[ "$mem_free" -lt {memory} ] && reject "$host has $mem_free MB of memory free, not {memory}"\n'
             f'reject "$host has $cpus_free free CPU(s), not {cpus}"')
    memory_file = f'printf "%s\\n" {memory} > "$d/memory"\n' if memory else ""
    runtime = ""
    if request.container_image:  # a machine without the pool's runtime (added since the probe) refuses
        word = shlex.quote(request.container_runtime or "")
        runtime = f'command -v {word} >/dev/null 2>&1 || reject "$host has no {word} to run the image"\n'
    memory_total = ('free_mem; [ "$mem_total" -lt ' + f'{memory} ] && '
                    f'reject "$host has $mem_total MB of memory, not {memory}"\n' if memory else "")
    return f"""\
set -u
umask 077
host=${{HOSTNAME:-$(hostname)}}
base="$HOME/{POOL_DIR}/$host"
d={directory}
mkdir -p "$base/held" "$base/cpus" "$base/mem" "$base/queue" || exit 1
reject() {{ rm -rf -- "$d"; echo "{MARK} rejected $1"; exit 0; }}
exec 9>"$base/lock"
existing() {{  # on a shared home, another machine may have taken it (a retry whose first answer was lost)
  if [ -s "$d/pid" ] || [ -e "$d/queued" ]; then
    took=$host; [ -s "$d/host" ] && read -r took < "$d/host"
    echo "{MARK} submitted $took/{token} existing"; exit 0
  fi
}}
flock -w 20 9 || {{ existing; reject "another launch on $host holds its lock"; }}
existing
{runtime}{claims.install(configured)}mkdir -p "$d/workdir" || exit 1
{copy}{writes}printf '%s %s %s\\n' {gpus} {cpus} {kind} > "$d/wants"
printf '%s\\n' "$host" > "$d/host"
{memory_file}fits "$d"
[ "$total" -lt {gpus} ] && reject "$host has $total GPU(s) of the kind asked, not {gpus}"
[ "$cpus_total" -lt {cpus} ] && reject "$host has $cpus_total CPU(s), not {cpus}"
{memory_total}enqueue "$d" {token} && drain
if [ -s "$d/pid" ]; then echo "{MARK} submitted $host/{token} new"; exit 0; fi
{waits}
"""


NODES_FILE = "nodes"  # in a multi-node task's rank run dir: how many ranks the task has
OTHERS_WINDOW_SECONDS = 3600  # `others`: runs touched this recently (the tracker watches a place for an hour)


def status_script(tokens: Sequence[str], others: bool = False) -> str:
    """First start what now fits in the machine's queue (a task killed outright ran no exit trap), then
    one line per token: `<token> <state> <exit code or -> <started epoch or -> <ended epoch or ->`,
    state one of running, ended, cancelled, timeout (ended by its walltime's watchdog), out_of_memory
    (ended by the watchdog for using more than it asked: third field `<used MB>:<limit MB>`), vanished (its
    process gone with no exit code), unknown, or
    queued, whose third field is `<tasks ahead>:<gpus>:<cpus>:<memory MB>`, and a sixth its GPU type
    (what it waits for); or, for a task on its way to another machine of the pool (moves.py), `<token>
    moving <target> <since epoch> -`, and `<token> moved <machine> - -` where a shared home's run dir
    names the machine that took it. With `others`, also a line for every other run this machine took
    (its `host` file) that is queued there or was touched in the last OTHERS_WINDOW_SECONDS (a submission
    whose answer was lost: the tracker finds it by token); a multi-node task's rank (`<token>.<rank>`)
    after `@@corral ranks <token>.<rank> <nodes>`, from its `nodes` file, so that the pool can tell a
    whole task from what a submission that died half-way left."""
    for token in tokens:
        check_token(token)
    body = " ".join(tokens)
    listing = "" if not others else f"""\
declare -A asked=(); for t in {body}; do asked[$t]=1; done
{{ [ "${{#ahead[@]}}" -gt 0 ] && printf '%s\\n' "${{!ahead[@]}}"
  find "$HOME/{RUNS_DIR}" -mindepth 1 -maxdepth 1 -type d -newermt "@$(( $(date +%s) - {OTHERS_WINDOW_SECONDS} ))" \\
    -printf '%f\\n' 2>/dev/null
}} | sort -u | while read -r t; do
  [[ $t =~ ^[0-9a-f]{{12}}([.][0-9]+)?$ ]] && [ -z "${{asked[$t]:-}}" ] || continue
  read -r took 2>/dev/null < "$HOME/{RUNS_DIR}/$t/host" && [ "$took" = "$me" ] || continue
  if [[ $t == *.* ]]; then
    read -r n 2>/dev/null < "$HOME/{RUNS_DIR}/$t/{NODES_FILE}" && [[ $n =~ ^[0-9]+$ ]] || continue
    echo "{MARK} ranks $t $n"
  fi
  report "$t"
done
"""
    return f"""\
{ALIVE}{claims.drain_now(2)}printf '{MARK} clock %s\\n' "$(date +%s)"
me=${{HOSTNAME:-$(hostname)}}  # a home shared by several machines holds their run dirs side by side
declare -A ahead=(); i=0
for entry in "$base/queue/"*; do [ -e "$entry" ] && ahead[${{entry##*_}}]=$i && i=$((i + 1)); done
report() {{
  local t=$1 d="$HOME/{RUNS_DIR}/$1" at pid= since= ended state g c m type took= target since_move
  if read -r took 2>/dev/null < "$d/host" && [ "$took" != "$me" ]; then echo "$t moved $took - -"; return; fi
  if [ -s "$d/moving" ] && read -r target _ since_move _ < "$d/moving"; then
    echo "$t moving $target $since_move -"; return
  fi
  at=$( [ -f "$d/pid" ] && stat -c %Y "$d/pid" || echo -)
  [ -s "$d/pid" ] && read -r pid since < "$d/pid"
  if [ -e "$d/timed_out" ] && ! alive "$pid" "$since"; then
    echo "$t timeout - $at $(stat -c %Y "$d/timed_out")"
  elif [ -s "$d/out_of_memory" ] && ! alive "$pid" "$since" && read -r g m < "$d/out_of_memory"; then
    echo "$t out_of_memory $g:$m $at $(stat -c %Y "$d/out_of_memory")"
  elif [ -f "$d/exit_code" ]; then
    ended=$(stat -c %Y "$d/exit_code")
    if [ -e "$d/cancelled" ]; then state=cancelled; else state=ended; fi
    echo "$t $state $(head -c 12 "$d/exit_code") $at $ended"
  elif alive "$pid" "$since"; then
    echo "$t running - $at -"
  elif [ -e "$d/cancelled" ]; then
    echo "$t cancelled - $at $(stat -c %Y "$d/cancelled")"
  elif [ -n "$pid" ]; then
    echo "$t vanished - $at -"
  elif [ -e "$d/queued" ] && read -r g c type < "$d/wants"; then
    m=0; [ -s "$d/memory" ] && read -r m < "$d/memory"
    echo "$t queued ${{ahead[$t]:-0}}:$g:$c:$m - - $type"
  else
    echo "$t unknown - - -"
  fi
}}
for t in {body}; do report "$t"; done
{listing}"""


def cancel_script(tokens: Sequence[str]) -> str:
    """Leave each task's cancel marker (a queued task leaves the queue), then TERM its process group, and
    KILL what is left 10 s later; then what now fits in the machine's queue starts. A task another
    machine took from this one (a shared home's run dir names it) is named, `@@corral moved <token>
    <machine>`, to be cancelled there too."""
    for token in tokens:
        check_token(token)
    body = " ".join(tokens)
    drain = claims.drain_now(30).replace("\n", "\n  ")
    return f"""\
{ALIVE}me=${{HOSTNAME:-$(hostname)}}
base="$HOME/{POOL_DIR}/$me"
for t in {body}; do
  d="$HOME/{RUNS_DIR}/$t"
  [ -d "$d" ] || continue
  if read -r took 2>/dev/null < "$d/host" && [ "$took" != "$me" ]; then echo "{MARK} moved $t $took"; fi
  : > "$d/cancelled"
  rm -f -- "$base/queue/"*"_$t" "$d/queued"
  pid= since=
  [ -s "$d/pid" ] && read -r pid since < "$d/pid"
  alive "$pid" "$since" || continue
  kill -TERM -- "-$pid" 2>/dev/null
  ( sleep 10; alive "$pid" "$since" && kill -KILL -- "-$pid" 2>/dev/null
  {drain}) </dev/null >/dev/null 2>&1 &
done
{claims.drain_now(5)}exit 0
"""


def remove_env_script(tokens: Sequence[str]) -> str:
    """Remove each rank's env.sh (the task's env values, secrets included) once its task has ended."""
    return remove_script([f"{run_dir(token)}/env.sh" for token in tokens], "-f")


def remove_run_dirs_script(tokens: Sequence[str]) -> str:
    """Remove each rank's whole run directory (`run_dirs: {keep_days: N}`)."""
    return remove_script([run_dir(token) for token in tokens], "-rf")


def follow_script(token: str, follow: bool, tail: int = 0) -> str:
    """Print the task's log (with `tail` > 0, its last `tail` lines); with `follow`, until it has ended."""
    directory = run_dir_word(token)
    lines = tail_lines(tail)
    if not follow:
        return f"tail {lines} {directory}/log.txt 2>/dev/null; exit 0\n"
    alive = f'{{ read -r pid since < {directory}/pid 2>/dev/null && alive "$pid" "$since"; }}'
    return (ALIVE + f"f={directory}/log.txt\n"
            f'while [ ! -e "$f" ] && {alive}; do sleep 1; done\n'
            '[ -e "$f" ] || exit 0\n'
            f'tail {lines} -F "$f" 2>/dev/null & t=$!\n'
            f"while {alive}; do sleep 1; done\n"
            "sleep 1; kill $t 2>/dev/null; wait $t 2>/dev/null; exit 0\n")
