"""What a pool machine's tasks hold and wait for, as a bash library (pure: run on the testbed, and in the
tests with real bash in a scratch home).

Everything lives under `~/.corral/pool/<hostname>/` and changes only under its `lock` (flock):
- `held/<gpu index>`: `<token> <pid> <start>` of the task holding that GPU;
- `cpus/<token>`: `<cpus> <pid> <start>`, the cores a task holds;
- `mem/<token>`: `<MB> <pid> <start>`, the memory a task holds (of the machine's MemTotal), when it
  asked for some;
- `queue/<time>_<gpus>_<cpus>_<token>`: a task waiting, oldest first; its run dir holds `wants`
  (`<gpus> <cpus> <type>`), `memory` (MB, when asked) and `queued`.

A claim counts while its process lives (pid and start time, `inventory.ALIVE`), so a task that died
frees what it held without anyone cleaning up. `drain` starts waiting tasks in order while they fit;
one that does not fit holds back those after it that want what it waits for (its GPU type, CPUs, or
memory),
so a big task is never overtaken for ever by small ones of its kind, while tasks that want something
else pass it. It runs when a task is submitted, when a task on the machine ends (the task's own exit
trap, `runner.END_TRAP`), and with each status round trip (which covers a task killed outright).

The library is written to `pool.sh` by each submission (only when its version line differs), so the
exit trap and the status script can source it without knowing the machine's GPUs.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Sequence

from corral.infra.sshpool.inventory import ALIVE, NVIDIA_SMI_TIMEOUT, POOL_DIR, RUNS_DIR

LIBRARY = "pool.sh"


def gpu_list(configured: Sequence[str]) -> str:
    """Bash printing `index, name` per GPU: nvidia-smi's, else the pool's config for this machine."""
    if configured:
        return "printf '%s\\n' " + " ".join(shlex.quote(f"{i}, {name}") for i, name in enumerate(configured))
    return (f"{{ command -v nvidia-smi >/dev/null 2>&1 && timeout {NVIDIA_SMI_TIMEOUT} "
            "nvidia-smi --query-gpu=index,name --format=csv,noheader; }")


def cpus_wanted(cpus: int | None, gpus: int) -> int:
    """The cores a task holds on a machine: what it asks; without `cpus`, one for a CPU-only task (as
    Slurm gives one per task), none beyond its GPUs for a GPU task (it shares the machine's cores)."""
    if cpus is not None:
        return max(0, cpus)
    return 0 if gpus else 1


def library(configured: Sequence[str]) -> str:
    """The functions, for `base` (the machine's folder) set by the caller; the first line names the
    version, so that a submission rewrites the file only when it changed."""
    body = f"""\
{ALIVE}gpu_lines() {{ [ -n "${{gpus_seen+x}}" ] || gpus_seen=$({gpu_list(configured)}); printf '%s\\n' "$gpus_seen"; }}
free_gpus() {{  # $1: a type ('' any): sets free (their indices) and total
  local index name holder since
  free=(); total=0
  while IFS=, read -r index name; do
    index="${{index//[[:space:]]/}}"; name="${{name#"${{name%%[![:space:]]*}}"}}"
    [ -n "$index" ] || continue
    [ -z "$1" ] || [ "$name" = "$1" ] || continue
    total=$((total + 1))
    if [ -f "$base/held/$index" ]; then
      read -r _ holder since < "$base/held/$index" || holder=
      alive "$holder" "${{since:-}}" && continue
    fi
    free+=("$index")
  done < <(gpu_lines)
}}
claimed() {{  # $1: cpus or mem: sets used, what live tasks claim there (an ended task's claim is removed)
  local f n pid since
  used=0
  for f in "$base/$1/"*; do
    [ -f "$f" ] || continue
    read -r n pid since < "$f" || continue
    if alive "$pid" "$since"; then used=$((used + n)); else rm -f -- "$f"; fi
  done
}}
free_cpus() {{  # sets cpus_free and cpus_total
  [ -n "${{cpus_total:-}}" ] || cpus_total=$(nproc 2>/dev/null || echo 1)
  claimed cpus
  cpus_free=$((cpus_total - used))
}}
free_mem() {{  # sets mem_free and mem_total (MB): MemTotal less the live tasks' claims
  local kb
  [ -n "${{mem_total:-}}" ] || {{ read -r _ kb _ < <(grep -m1 '^MemTotal:' /proc/meminfo); mem_total=$((kb / 1024)); }}
  claimed mem
  mem_free=$((mem_total - used))
}}
fits() {{  # $1: a run dir: do its wants fit now? Sets want_gpus, want_cpus, want_type, want_mem, free, total,
  # cpus_*, mem_* (mem_free only when it wants memory)
  read -r want_gpus want_cpus want_type < "$1/wants" || return 1
  want_mem=0; [ -s "$1/memory" ] && read -r want_mem < "$1/memory"
  if [ "$want_gpus" -gt 0 ]; then free_gpus "$want_type"; else free=(); total=0; fi
  free_cpus
  mem_free=0; [ "$want_mem" -gt 0 ] && free_mem
  [ "${{#free[@]}}" -ge "$want_gpus" ] && [ "$cpus_free" -ge "$want_cpus" ] && [ "$mem_free" -ge "$want_mem" ]
}}
start() {{  # $1: a run dir, $2: its token: claim what fits found free, and start job.sh
  local pick=("${{free[@]:0:$want_gpus}}") pid since index
  export CUDA_VISIBLE_DEVICES=
  [ "$want_gpus" -gt 0 ] && CUDA_VISIBLE_DEVICES=$(IFS=,; echo "${{pick[*]}}")
  cd "$1" || return 1
  setsid bash "$1/job.sh" </dev/null >>"$1/log.txt" 2>&1 9>&- &
  pid=$!
  since=$(started "$pid")
  echo "$pid $since" > "$1/pid.new" && mv "$1/pid.new" "$1/pid"
  for index in "${{pick[@]}}"; do echo "$2 $pid $since" > "$base/held/$index"; done
  if [ "$want_cpus" -gt 0 ]; then echo "$want_cpus $pid $since" > "$base/cpus/$2"; fi
  if [ "$want_mem" -gt 0 ]; then echo "$want_mem $pid $since" > "$base/mem/$2"; fi
  rm -f -- "$1/queued"
}}
requeue() {{  # $1: a run dir, $2: its queue entry (a moved task keeps its own, and so its age)
  : > "$1/queued" && : > "$base/queue/$2"
}}
enqueue() {{  # $1: a run dir, $2: its token (fits has read its wants)
  local now=${{EPOCHREALTIME:-}}
  [ -n "$now" ] || now=$(date +%s.%6N)
  requeue "$1" "${{now/./}}_${{want_gpus}}_${{want_cpus}}_$2"
}}
release() {{  # $1: the token of a task that is ending: what it holds is free for the queue
  local f holder
  rm -f -- "$base/cpus/$1" "$base/mem/$1"
  for f in "$base/held/"*; do
    [ -f "$f" ] || continue
    read -r holder _ < "$f" || continue
    [ "$holder" = "$1" ] && rm -f -- "$f"
  done
  return 0
}}
drain() {{  # start waiting tasks in order while they fit; one that does not holds back what it waits for
  local entry name rest t g c q type block_cpus=0 block_any=0 block_mem=0
  local -A block_type=()
  for entry in "$base/queue/"*; do
    [ -e "$entry" ] || continue
    name=${{entry##*/}}; t=${{name##*_}}; rest=${{name%_*}}; c=${{rest##*_}}; rest=${{rest%_*}}; g=${{rest##*_}}
    q="$HOME/{RUNS_DIR}/$t"
    if [ "$c" -gt 0 ] && [ "$block_cpus" = 1 ]; then continue; fi
    if [ "$g" -gt 0 ] && [ "$block_any" = 1 ]; then continue; fi
    if [ "$block_mem" = 1 ] && [ -s "$q/memory" ]; then continue; fi
    if [ -e "$q/cancelled" ] || [ ! -f "$q/wants" ]; then rm -f -- "$entry" "$q/queued"; continue; fi
    if [ "$g" -gt 0 ]; then
      read -r _ _ type < "$q/wants" || type=
      if [ -z "$type" ]; then [ "${{#block_type[@]}}" -gt 0 ] && continue
      elif [ -n "${{block_type[$type]+x}}" ]; then continue; fi
    fi
    if fits "$q"; then start "$q" "$t"; rm -f -- "$entry"; continue; fi
    if [ "${{#free[@]}}" -lt "$want_gpus" ]; then
      if [ -z "$want_type" ]; then block_any=1; else block_type[$want_type]=1; fi
    fi
    [ "$cpus_free" -lt "$want_cpus" ] && block_cpus=1
    [ "$mem_free" -lt "$want_mem" ] && block_mem=1
    [ "$block_cpus" = 1 ] && [ "$block_any" = 1 ] && return 0
  done
  return 0
}}
"""
    version = hashlib.sha256(body.encode()).hexdigest()[:16]
    return f"# corral {LIBRARY} {version}\n{body}"


def install(configured: Sequence[str]) -> str:
    """Bash (under the lock, `base` set) that writes the library when the machine's copy is another
    version, then sources it."""
    text = library(configured)
    first = text.split("\n", 1)[0]
    return (f'IFS= read -r have 2>/dev/null < "$base/{LIBRARY}" || have=\n'
            f"if [ \"$have\" != {shlex.quote(first)} ]; then\n"
            f"  printf '%s' {shlex.quote(text)} > \"$base/{LIBRARY}.$$\"\n"
            f"  mv \"$base/{LIBRARY}.$$\" \"$base/{LIBRARY}\"\n"
            "fi\n"
            f'. "$base/{LIBRARY}"\n')


def drain_now(wait_seconds: int) -> str:
    """Bash starting what now fits in the machine's queue (nothing when the queue is empty or its
    lock stays busy `wait_seconds`), its output nowhere; it sets `base`."""
    return ('base="$HOME/' + POOL_DIR + '/${HOSTNAME:-$(hostname)}"\n'
            f'queued=("$base/queue/"*)\n'
            f'if [ -e "${{queued[0]}}" ] && [ -f "$base/{LIBRARY}" ]; then\n'
            f'  ( exec 9>"$base/lock"; flock -w {int(wait_seconds)} 9 || exit 0; . "$base/{LIBRARY}" && drain ) '
            "</dev/null >/dev/null 2>&1\n"
            "fi\n")
