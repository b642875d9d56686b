"""The files a Corral job consists of on a Slurm cluster, and the script that submits them.

A job's run directory (`~/.corral/runs/<token>/`) holds:
- `job.sbatch`: the batch script (golden-file tested): sbatch options, the CORRAL_*/SKYPILOT_*
  environment, and one `srun` step across the allocation running `task.sh` on every node; a
  single-node task without a Pyxis image runs `task.sh` in the batch step itself, with no step (one
  request to slurmctld fewer per task, which matters for large sweeps of short tasks);
- `task.sh`: per node: rank, then `setup.sh`, then `run.sh`, from the job's `workdir/`;
- the step-start bound, where there is a step: a watcher in the batch script ends the job when the
  step has not started `task.sh` on every node within `step_start_bound` seconds of the script's start
  (a lost step reply can otherwise leave it waiting in srun for hours), and says so in the job's
  comment, which the status query already reads: no round trip of its own;
- `env.sh`: the task's envs, each value quoted with shlex.quote, so it arrives byte for byte. Only the
  processes that run `setup.sh` and `run.sh` source it: Corral's own commands (srun, scontrol, …)
  never run under the task's environment, so `PATH=/x` in a task cannot break them;
- `setup.sh`, `run.sh`: the user's commands, verbatim; `task_ids` for job arrays;
- with an image: Pyxis options on the `srun` step (the step runs in the image), or `container.sh`,
  through which `task.sh` runs setup and run in the image with Apptainer or Singularity.

Nothing is installed on the cluster: bash, coreutils, getent and the Slurm commands are all it needs.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field

from corral.config import env_number
from corral.infra.base import JobRequest
from corral.infra.shell import (
    CONTAINER_FILE,
    WRAPPED_RUNTIMES,
    UnsafeScriptValueError,
    check_image,
    checkpoint_lines,
    container_wrapper,
    render_env,
    write_file,
)
from corral.infra.slurm.environment import unset_named
from corral.sbatch_script import ScriptError, parse_options

RUNS_DIR = ".corral/runs"  # relative to the user's home on the cluster
JOB_NAME_PREFIX = "corral-"
# The step-start bound, in seconds from the batch script's start to task.sh running on every node; an
# image gets longer (Pyxis pulls it while the step starts). CORRAL_STEP_START_BOUND, on the server,
# sets both.
STEP_START_BOUND = 300
IMAGE_STEP_START_BOUND = 1800
STEP_START_BOUND_ENV = "CORRAL_STEP_START_BOUND"
# A job the bound ended carries this at the start of its comment (a script's jobs use the comment for
# their token, "corral-…"; the bound only applies to Corral's own job scripts, whose token is their name).
STEP_COMMENT_PREFIX = "Corral: "


def step_start_bound(container_runtime: str | None) -> int:
    """The bound for a job's step: the server's CORRAL_STEP_START_BOUND, else the default for its kind."""
    default = IMAGE_STEP_START_BOUND if container_runtime == "pyxis" else STEP_START_BOUND
    return math.ceil(env_number(STEP_START_BOUND_ENV, default, minimum=1))


@dataclass(frozen=True)
class SlurmJobSpec:
    """Everything needed to write and submit one sbatch job (or one job array)."""

    token: str
    task_ids: tuple[str, ...]  # one Corral job id per array task (one element: no array)
    cluster: str
    partition: str
    num_nodes: int
    gres: str | None  # e.g. "gpu:nvidia_h100_80gb_hbm3:2"
    gpus_per_node: int
    cpus_per_node: int | None
    memory_mb: int | None
    envs: dict[str, str]
    setup: str | None
    run: str | None
    time: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    reservation: str | None = None
    sbatch_args: tuple[str, ...] = ()
    first_rank: int = 0  # CORRAL_JOB_RANK of array task 0
    num_jobs: int = 1  # CORRAL_NUM_JOBS
    extra_env: dict[str, str] = field(default_factory=dict)
    checkpoint_dir: str | None = None  # managed jobs: relative to the remote home unless absolute
    container_image: str | None = None  # an OCI image reference (validated: no spaces, quotes or $)
    container_runtime: str | None = None  # pyxis, apptainer or singularity
    step_start_bound: int = STEP_START_BOUND  # seconds (see STEP_START_BOUND)

    @property
    def is_array(self) -> bool:
        return len(self.task_ids) > 1

    @property
    def job_name(self) -> str:
        return JOB_NAME_PREFIX + self.token

    @property
    def run_dir(self) -> str:
        return f"{RUNS_DIR}/{self.token}"

    def log_path(self, index: int | None = None) -> str:
        return f"{self.run_dir}/log-{index}.txt" if index is not None else f"{self.run_dir}/log.txt"


def spec_for(request: JobRequest, cluster: str) -> SlurmJobSpec:
    """The sbatch job for a generic request: the GRES from the accelerator type, the `slurm:` options."""
    options = request.scheduler_options
    gres = None
    if request.accelerators_per_node:
        count = request.accelerators_per_node
        gres = f"gpu:{request.accelerator_type}:{count}" if request.accelerator_type else f"gpu:{count}"
    return SlurmJobSpec(
        token=request.token,
        task_ids=request.task_ids,
        cluster=cluster,
        partition=request.place,
        num_nodes=request.num_nodes,
        gres=gres,
        gpus_per_node=request.accelerators_per_node,
        cpus_per_node=request.cpus_per_node,
        memory_mb=request.memory_mb,
        envs=request.envs,
        setup=request.setup,
        run=request.run,
        time=options.get("time"),
        account=options.get("account"),
        qos=options.get("qos"),
        constraint=options.get("constraint"),
        reservation=options.get("reservation"),
        sbatch_args=tuple(options.get("sbatch_args") or ()) + (() if request.requeue else ("--no-requeue",))
        + (("--hold",) if request.held else ()),
        first_rank=request.first_rank,
        num_jobs=request.num_jobs,
        extra_env=dict(request.extra_env),
        checkpoint_dir=request.checkpoint_dir,
        container_image=request.container_image,
        container_runtime=request.container_runtime,
        step_start_bound=step_start_bound(request.container_runtime),
    )


_LINE_BREAKERS = re.compile(r"[\x00-\x1f\x7f\s]")


def sbatch_options(spec: SlurmJobSpec) -> list[str]:
    """The job's sbatch options (also used for `sbatch --test-only`). Each is one `#SBATCH` word:
    nothing in them may end the line or split it."""
    options = _sbatch_options(spec)
    for option in options:
        if _LINE_BREAKERS.search(option):
            raise UnsafeScriptValueError(f"sbatch option {option!r} holds a space or control character; "
                                         "it cannot go into a job script")
    return options


def _sbatch_options(spec: SlurmJobSpec) -> list[str]:
    opts = [
        f"--nodes={spec.num_nodes}",
        "--ntasks-per-node=1",
        f"--partition={spec.partition}",
    ]
    if spec.gres:
        opts.append(f"--gres={spec.gres}")
    if spec.cpus_per_node:
        opts.append(f"--cpus-per-task={spec.cpus_per_node}")
    if spec.memory_mb:
        opts.append(f"--mem={spec.memory_mb}M")
    for flag, value in (("time", spec.time), ("account", spec.account), ("qos", spec.qos),
                        ("constraint", spec.constraint), ("reservation", spec.reservation)):
        if value:
            opts.append(f"--{flag}={value}")
    opts.extend(spec.sbatch_args)
    return opts


def render_sbatch(spec: SlurmJobSpec) -> str:
    lines = ["#!/bin/bash", f"#SBATCH --job-name={spec.job_name}"]
    lines += [f"#SBATCH {opt}" for opt in sbatch_options(spec)]
    if spec.is_array:
        lines += [f"#SBATCH --array=0-{len(spec.task_ids) - 1}", "#SBATCH --output=log-%a.txt"]
    else:
        lines.append("#SBATCH --output=log.txt")
    lines.append("#SBATCH --open-mode=append")
    env = {
        "CORRAL_CLUSTER": spec.cluster,
        "CORRAL_NUM_GPUS_PER_NODE": str(spec.gpus_per_node),
        "CORRAL_NUM_JOBS": str(spec.num_jobs),
        **spec.extra_env,
    }
    lines += [
        "# Written by Corral. Runs setup then run on every node (in one srun step, where it takes one).",
        "set -u",
        'export CORRAL_RUN_DIR="$SLURM_SUBMIT_DIR"',
        "cd \"$CORRAL_RUN_DIR\"",
        # Corral writes this marker before it scancels the job (see jobs.cancel_script): a kill that
        # reached the node while the job was still being launched, and so found nothing to kill,
        # must not let the task run anyway.
        f'if [ -e "{CANCEL_MARKER}${{SLURM_ARRAY_TASK_ID:+.$SLURM_ARRAY_TASK_ID}}" ]; then '
        # Not 0: Slurm would call it COMPLETED, and Corral a success of a task that never ran.
        'echo "corral: cancelled before it started"; exit 143; fi',
    ]
    in_batch_step = spec.num_nodes == 1 and spec.container_runtime != "pyxis"
    if not in_batch_step:
        lines += step_bound_lines(spec.num_nodes, spec.step_start_bound)
    if spec.is_array:
        lines += [
            'export CORRAL_TASK_ID="$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" task_ids)"',
            f"export CORRAL_JOB_RANK=$(({spec.first_rank} + SLURM_ARRAY_TASK_ID))",
        ]
    else:
        lines += [
            f"export CORRAL_TASK_ID={shlex.quote(spec.task_ids[0])}",
            f"export CORRAL_JOB_RANK={spec.first_rank}",
        ]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in sorted(env.items())]
    if spec.checkpoint_dir:
        lines += checkpoint_lines(spec.checkpoint_dir, '"$CORRAL_TASK_ID"')
    lines += node_env_lines('"$SLURM_JOB_NODELIST"')
    if in_batch_step:
        # One node, no Pyxis image: the task runs in the batch step itself, as a group of its own (for
        # the cancel fence), with no srun step: a step is one more request to slurmctld per task, and
        # a step launch that fails under load can leave the task hanging in srun.
        lines.append('export SLURM_NODEID="${SLURM_NODEID:-0}"')
        lines.append('exec setsid -w bash "$CORRAL_RUN_DIR/task.sh"')
    else:
        lines.append(f"srun {srun_label(spec.num_nodes)}--nodes={spec.num_nodes} --ntasks-per-node=1 "
                     "--kill-on-bad-exit=1 "
                     f"{pyxis_options(spec)}bash \"$CORRAL_RUN_DIR/task.sh\"")
    return "\n".join(lines) + "\n"


def srun_label(nodes: int | str) -> str:
    """srun's `--label` for a step on several nodes: each line of its output starts with its node's rank
    ("0: "), as everywhere Corral runs on several nodes (infra/ranks.py). `nodes`: their count, or a
    shell word that expands to it."""
    if isinstance(nodes, int) or nodes.isdigit():
        return "--label " if int(nodes) > 1 else ""
    return f"$([ {nodes} -gt 1 ] && echo --label) "


def step_bound_lines(num_nodes: int, bound: int) -> list[str]:
    """The step-start bound's watcher (see the module's docstring). task.sh leaves a mark per node as it
    starts; past the bound, the watcher records why in the job's comment and ends srun and the script
    (the job then fails, and the status query reads the comment as an infrastructure failure)."""
    why = (f"the srun step started on ${{#started[@]}} of {int(num_nodes)} node(s) within {int(bound)} s "
           "of the batch script; Corral ended the job")
    return [
        "# The step-start bound: task.sh must start on every node within the bound, or the job ends.",
        'export CORRAL_STEP_MARK="$CORRAL_RUN_DIR/step_started${SLURM_ARRAY_TASK_ID:+.$SLURM_ARRAY_TASK_ID}"',
        'rm -f "$CORRAL_STEP_MARK".*',
        "(",
        "  trap '' TERM",
        f"  for _ in $(seq {int(bound)}); do",
        '    kill -0 $$ 2>/dev/null || exit 0',
        '    started=("$CORRAL_STEP_MARK".*); [ -e "${started[0]}" ] || started=()',
        f'    [ "${{#started[@]}}" -ge {int(num_nodes)} ] && exit 0',
        "    sleep 1",
        "  done",
        '  started=("$CORRAL_STEP_MARK".*); [ -e "${started[0]}" ] || started=()',
        f'  why="{why}"',
        '  echo "corral: $why"',
        '  timeout 10 scontrol update JobId="${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}${SLURM_ARRAY_TASK_ID:+_$SLURM_ARRAY_TASK_ID}" '
        f'Comment="{STEP_COMMENT_PREFIX}$why" >/dev/null 2>&1',
        # The batch script leads its process group (slurmstepd makes it so), srun in it: end them all.
        '  kill -TERM -- -$$ 2>/dev/null || kill -TERM $$',
        ") </dev/null &",
    ]


def _image(spec: SlurmJobSpec) -> str:
    return check_image(spec.container_image or "")


def pyxis_options(spec: SlurmJobSpec) -> str:
    """With Pyxis, the step itself runs in the image: the home (where the run directory is) mounted at
    the same path, the job's workdir as the working directory. Nothing otherwise."""
    if spec.container_runtime != "pyxis":
        return ""
    # Pyxis takes docker://-less references; a registry host is separated by '#' (enroot's syntax).
    image = _image(spec).replace("/", "#", 1) if "." in _image(spec).split("/")[0] else _image(spec)
    return (f"--container-image={image} --container-mounts=\"$HOME:$HOME\" "
            "--container-workdir=\"$CORRAL_RUN_DIR/workdir\" ")


def container_script(spec: SlurmJobSpec) -> str | None:
    """`container.sh CMD…`: runs CMD in the task's image with Apptainer or Singularity (task.sh calls it
    for setup and run only: Corral's own commands stay on the host). None without one of those."""
    if spec.container_runtime not in WRAPPED_RUNTIMES:
        return None
    return container_wrapper(spec.container_runtime or "", _image(spec), bool(spec.gpus_per_node))


def node_env_lines(nodelist: str) -> list[str]:
    """Bash exporting CORRAL_NUM_NODES and CORRAL_NODE_IPS (rank order) for a Slurm node list
    expression, plus their SKYPILOT_* twins. Needs CORRAL_TASK_ID and CORRAL_NUM_GPUS_PER_NODE set."""
    return [
        "# Node addresses in rank order (Slurm's NodeAddr, resolved to an IPv4 address where possible).",
        "CORRAL_NODE_IPS=",
        "CORRAL_NUM_NODES=0",
        f"for node in $(scontrol show hostnames {nodelist}); do",
        '  addr=$(scontrol show node -o "$node" | tr " " "\\n" | sed -n "s/^NodeAddr=//p")',
        '  ip=$(getent ahostsv4 "${addr:-$node}" 2>/dev/null | awk "NR == 1 {print \\$1}")',
        '  CORRAL_NODE_IPS="${CORRAL_NODE_IPS:+$CORRAL_NODE_IPS$\'\\n\'}${ip:-${addr:-$node}}"',
        "  CORRAL_NUM_NODES=$((CORRAL_NUM_NODES + 1))",
        "done",
        "export CORRAL_NODE_IPS CORRAL_NUM_NODES",
        'export SKYPILOT_TASK_ID="$CORRAL_TASK_ID" SKYPILOT_NODE_IPS="$CORRAL_NODE_IPS"',
        'export SKYPILOT_NUM_NODES="$CORRAL_NUM_NODES" SKYPILOT_NUM_GPUS_PER_NODE="$CORRAL_NUM_GPUS_PER_NODE"',
    ]


TASK_SH = """\
# Written by Corral: runs on every node of the job: task.sh [SETUP_FILE [RUN_FILE [ENV_FILE]]] ("" skips one).
# The task's envs (ENV_FILE) are sourced only by the bash that runs setup or run, never by this script.
set -u
# A task that slurmstepd launches while it is killing the step can start with SIGTERM blocked (the
# churn test caught one: Slurm called the job CANCELLED, and the task ran on to its end next to its
# replacement). Blocked signals survive exec, so neither Slurm's kill nor the cancel fence below would
# reach it: start again with SIGTERM deliverable (coreutils env, else perl; both keep this process).
if [ -z "${CORRAL_TERM_UNBLOCKED-}" ]; then
  mask=$(awk '$1 == "SigBlk:" {print $2}' /proc/$$/status 2>/dev/null)
  if (( (16#${mask:-0} >> 14) & 1 )); then
    export CORRAL_TERM_UNBLOCKED=1
    if env --default-signal=TERM true 2>/dev/null; then
      exec env --default-signal=TERM "$BASH" "$0" "$@"
    elif command -v perl >/dev/null 2>&1; then
      exec perl -e 'use POSIX; sigprocmask(SIG_SETMASK, POSIX::SigSet->new); exec @ARGV or die "$!"' "$BASH" "$0" "$@"
    fi
    echo "corral: the task starts with SIGTERM blocked, and neither env --default-signal nor perl can unblock it" >&2
  fi
fi
# The step-start bound's mark: this node's task.sh has started (see job.sbatch).
[ -n "${CORRAL_STEP_MARK-}" ] && : > "$CORRAL_STEP_MARK.${SLURM_NODEID:-0}"
setup="${1-$CORRAL_RUN_DIR/setup.sh}"
run="${2-$CORRAL_RUN_DIR/run.sh}"
envfile="${3-$CORRAL_RUN_DIR/env.sh}"
export CORRAL_NODE_RANK="$SLURM_NODEID" SKYPILOT_NODE_RANK="$SLURM_NODEID"
# A job group's task names this node for the group's other tasks, which run on this cluster too: one
# file per node, TASK-RANK, holding its host name (each attempt writes its own afresh), in the folder
# of the group's round (the tasks placed together; a group that moves whole starts a new one).
if [ -n "${CORRAL_JOBGROUP_TASK-}" ] && [ -n "${CORRAL_PIPELINE_ID-}" ]; then
  export CORRAL_JOBGROUP_HOSTS="$HOME/.corral/groups/$CORRAL_PIPELINE_ID${CORRAL_JOBGROUP_ROUND:+/$CORRAL_JOBGROUP_ROUND}"
  host_file="$CORRAL_JOBGROUP_HOSTS/$CORRAL_JOBGROUP_TASK-$SLURM_NODEID"
  mkdir -p "$CORRAL_JOBGROUP_HOSTS" && hostname > "$host_file.$$" && mv -f "$host_file.$$" "$host_file"
fi
cd "$CORRAL_RUN_DIR/workdir"
# The cancel fence. Corral leaves this marker before its scancel; a kill that Slurm delivers while it
# is still launching the step can miss the task, and Slurm then reports the job cancelled while the
# task runs on. A watcher, detached from the task's output, ends the task (its process group when it
# leads one, as under srun) within a second of the marker, and itself once the task is gone. A task
# launched during that kill can start with SIGTERM blocked (slurmstepd passes its signal mask on), so
# TERM would wait unseen while the task ran to its end: then the watcher sends KILL at once. What the
# watcher does is noted in fence.log (fence.<array index>.log).
# Once the task has ended, the watcher ends what it left in its process group (when it leads one), as
# Slurm's proctrack/cgroup does at a step's end: under proctrack/linuxproc a process forked while Slurm
# was killing its parent (srun's --kill-on-bad-exit on another node) outlives it unseen, and its open
# output keeps srun, and so the step, waiting for it to end by itself.
marker="$CORRAL_RUN_DIR/cancelled${SLURM_ARRAY_TASK_ID:+.$SLURM_ARRAY_TASK_ID}"
fence_log="$CORRAL_RUN_DIR/fence${SLURM_ARRAY_TASK_ID:+.$SLURM_ARRAY_TASK_ID}.log"
stop_if_cancelled() {  # the marker may have come after the job's script looked, while srun started this
  [ -e "$marker" ] || return 0
  echo "corral: cancelled before it started" >&2
  echo "$(date +%s.%N) $(hostname) marker seen before the $1 started; not started" >> "$fence_log"
  exit 143
}
stop_if_cancelled task  # before the watcher below, which would otherwise race this to the marker
task=$$ group=
read -r _ _ _ _ group _ < /proc/$$/stat 2>/dev/null || group=
[ "$group" = "$task" ] && target="-$task" || target="$task"
(
  trap '' TERM INT HUP
  while kill -0 "$task" 2>/dev/null; do
    if [ -e "$marker" ]; then
      blocked=$(awk '$1 == "SigBlk:" || $1 == "SigIgn:" {printf "%s ", $2}' /proc/"$task"/status 2>/dev/null)
      signal=TERM
      for mask in $blocked; do (( (16#$mask >> 14) & 1 )) && signal=KILL; done
      echo "$(date +%s.%N) $(hostname) marker seen; SigBlk/SigIgn $blocked; sending $signal" >> "$fence_log"
      kill -"$signal" -- "$target" 2>/dev/null
      for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$task" 2>/dev/null || exit 0; sleep 1; done
      echo "$(date +%s.%N) $(hostname) still there after 10 s; sending KILL" >> "$fence_log"
      kill -KILL -- "$target" 2>/dev/null
      exit 0
    fi
    sleep 1
  done
  [ "$target" = "-$task" ] || exit 0
  kill -TERM -- "$target" 2>/dev/null  # this watcher ignores TERM; a leftover that does too gets KILL
  sleep 2
  kill -KILL -- "$target" 2>/dev/null
) </dev/null >/dev/null 2>&1 &
# The task's image (Apptainer, Singularity): setup and run go through container.sh, with the image's bash.
inside=("$BASH")
[ -f "$CORRAL_RUN_DIR/container.sh" ] && inside=("$BASH" "$CORRAL_RUN_DIR/container.sh" bash)
# The task's env, then its commands, with the bash that sourced it (by path: the env may change PATH).
with_task_env() { "${inside[@]}" -c '. "$1" || exit 1; shift; exec "$BASH" "$@"' task-env "$envfile" "$@"; }
if [ -n "$setup" ] && [ -s "$setup" ]; then
  stop_if_cancelled setup
  with_task_env "$setup"
  rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "corral: setup failed on $(hostname) with exit code $rc" >&2
    echo "$rc" > "$CORRAL_RUN_DIR/setup_failed"
    exit "$rc"
  fi
fi
[ -n "$run" ] || exit 0
stop_if_cancelled task
exec "${inside[@]}" -c '. "$1" || exit 1; shift; exec "$BASH" "$@"' task-env "$envfile" "$run"
"""


def job_files(spec: SlurmJobSpec) -> dict[str, str]:
    files = {
        "job.sbatch": render_sbatch(spec),
        "task.sh": TASK_SH,
        "env.sh": render_env(spec.envs),
        "setup.sh": spec.setup or "",
        "run.sh": spec.run or "",
    }
    wrapper = container_script(spec)
    if wrapper is not None:
        files[CONTAINER_FILE] = wrapper
    if spec.is_array:
        files["task_ids"] = "".join(f"{tid}\n" for tid in spec.task_ids)
    return files


def write_files_script(run_dir: str, files: dict[str, str]) -> str:
    """Bash that creates the run directory and writes each file exactly (shell.write_file)."""
    out = [f'd="$HOME"/{shlex.quote(run_dir)}', 'mkdir -p "$d/workdir"']
    for folder in sorted({name.rsplit("/", 1)[0] for name in files if "/" in name}):
        out.append(f'mkdir -p "$d"/{shlex.quote(folder)}')
    out += [write_file(f'"$d"/{shlex.quote(name)}', content) for name, content in files.items()]
    return "\n".join(out) + "\n"


SBATCH_BUSY = "temporarily unable to accept job"
CANCEL_MARKER = "cancelled"  # in the run dir; "cancelled.<array index>" for an array task


def submit_script(spec: SlurmJobSpec, files: dict[str, str] | None = None, job_name: str | None = None) -> str:
    """Write the job's files and submit `job.sbatch`, unless a job with its name (and so its token)
    already exists: a retried or interrupted submission never makes a second job."""
    find = f"squeue -h --me -t all --name={shlex.quote(job_name or spec.job_name)} -o %A 2>/dev/null"
    return submit_files_script(spec.run_dir, job_files(spec) if files is None else files, find,
                               unset_named(_named_options(spec)) + "sbatch --parsable job.sbatch")


def _named_options(spec: SlurmJobSpec) -> list[str]:
    """The long names of the options the job's `#SBATCH` lines give (those environment.py cares for)."""
    names = [name for name, value in (("account", spec.account), ("qos", spec.qos),
                                      ("reservation", spec.reservation)) if value]
    try:
        names += [o.name for o in parse_options([(w, i, i + 1) for i, w in enumerate(spec.sbatch_args)], "sbatch_args")]
    except ScriptError:
        pass  # sbatch itself says what is wrong with them
    return names


def submit_files_script(run_dir: str, files: dict[str, str], find: str, sbatch: str) -> str:
    """Write a job's files into `run_dir` and run `sbatch` there (a command line whose words are quoted
    already), unless `find` prints the id of a job already submitted with this attempt's token. sbatch's
    output goes to sbatch.out, its errors to sbatch.err; the answer is one `@@corral` line."""
    lookup = f"existing=$({find}); existing=${{existing%%$'\\n'*}}\n"  # the first id, without a `head`
    return (
        "umask 077\n"
        + write_files_script(run_dir, files)
        + 'cd "$d" || exit 1\n'
        + lookup
        + 'if [ -n "$existing" ]; then echo "@@corral submitted $existing existing"; exit 0; fi\n'
        # A controller that refuses jobs (job table full at MaxJobCount, or overloaded) makes sbatch
        # sleep and retry for minutes; seen at once (sbatch's stderr is read as it comes), that is a
        # rejection and the job fails over. The job may have got in on a retry before sbatch was
        # stopped: its name says so.
        + f'exec 3< <({sbatch} 2>&1 >"$d/sbatch.out" & echo "@@pid $!"; wait $!; echo "@@rc $?")\n'
        + 'rc=1; busy=; pid=; : > "$d/sbatch.err"\n'
        + "while IFS= read -r line <&3; do\n"
        + '  case "$line" in\n'
        + '    "@@pid "*) pid=${line#@@pid }; if [ -n "$busy" ]; then kill "$pid" 2>/dev/null; fi ;;\n'
        + '    "@@rc "*) rc=${line#@@rc } ;;\n'
        + f'    *"{SBATCH_BUSY}"*) busy=1; printf \'%s\\n\' "$line" >> "$d/sbatch.err"; kill "$pid" 2>/dev/null ;;\n'
        + '    *) printf \'%s\\n\' "$line" >> "$d/sbatch.err" ;;\n'
        + "  esac\n"
        + "done\n"
        + "exec 3<&-\n"
        + 'if [ -n "$busy" ]; then\n'
        + "  " + lookup
        + '  if [ -n "$existing" ]; then echo "@@corral submitted $existing new"; else '
        + 'echo "@@corral rejected busy"; cat "$d/sbatch.err"; fi\n'
        + "  exit 0\n"
        + "fi\n"
        + 'out=; read -r out < "$d/sbatch.out"\n'
        + 'if [ "$rc" -eq 0 ]; then echo "@@corral submitted ${out%%;*} new"; '
        + 'else echo "@@corral rejected $rc"; cat "$d/sbatch.err"; fi\n'
    )
