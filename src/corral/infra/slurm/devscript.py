"""Dev allocations on Slurm: a holder batch job, and the scripts that exec into it, watch it, end it.

The holder is a native batch job named `corral-dev-<token>`. It runs the task's `setup` once on
every node (one srun step), marks itself ready, then waits for its walltime. Every exec and every
`corral ssh` session is a job step (`srun --jobid … --overlap`), so the holder itself can tell when
the allocation is idle: if no step but its own has run for the idle limit, it exits and the nodes
are released. No server has to be up for autodown to work.
"""

from __future__ import annotations

import dataclasses
import re
import shlex

from corral.infra.base import AllocationPhase, AllocationState, SessionKeys
from corral.infra.shell import (
    CONTAINER_FILE,
    EXEC_ENDED,
    EXEC_OUTPUT,
    EXEC_SETUP_FAILED,
    EXEC_START_WAIT,
    IDLE_LIMIT_FILE,
    SETUP_TAIL_LINES,
    check_exec_id,
    checked,
    claim_gpus,
    exec_ended_trap,
    exec_folder,
    follow_log_until_over,
    leave_cancel_marker,
    narrow_gpus,
    one_line_word,
    render_env,
    stop_if_cancelled,
    tail_lines,
)
from corral.infra.slurm.environment import login_shell_line
from corral.infra.slurm.jobs import CLOCK, STATE_MAP, parse_clock
from corral.infra.slurm.jobscript import (
    CANCEL_MARKER,
    JOB_NAME_PREFIX,
    TASK_SH,
    SlurmJobSpec,
    container_script,
    node_env_lines,
    sbatch_options,
    srun_label,
    submit_script,
    write_files_script,
)
from corral.infra.slurm.parsing import FIELD_SEPARATOR
from corral.infra.slurm.probe import MARK, split_sections

DEV_PREFIX = JOB_NAME_PREFIX + "dev-"
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]*\Z", re.ASCII)
_JOB_ID = re.compile(r"^\d+\Z", re.ASCII)


def _check_id(job_id: str) -> str:
    return checked(_JOB_ID, job_id, "a Slurm job id")


def holder_sbatch(spec: SlurmJobSpec, idle_seconds: int) -> str:
    """The allocation's batch script. `spec.task_ids[0]` is the allocation's name."""
    lines = ["#!/bin/bash", f"#SBATCH --job-name={DEV_PREFIX}{spec.token}"]
    lines += [f"#SBATCH {opt}" for opt in sbatch_options(spec)]
    lines += [
        "#SBATCH --output=log.txt",
        "#SBATCH --open-mode=append",
        # A requeued allocation would come back empty on other nodes: better to end and say why.
        "#SBATCH --no-requeue",
        "# Written by Corral: holds a dev allocation; releases it after the idle limit.",
        "set -u",
        'export CORRAL_RUN_DIR="$SLURM_SUBMIT_DIR"',
        # `corral down` leaves the cancel marker before its scancel, then removes the run dir: a holder
        # that starts after that (its scancel lost on the way) releases the nodes at once.
        f'cd "$CORRAL_RUN_DIR" 2>/dev/null && [ ! -e {CANCEL_MARKER} ] || '
        '{ echo "corral: released before it started"; exit 0; }',
        f"export CORRAL_TASK_ID={shlex.quote(spec.task_ids[0])} CORRAL_CLUSTER={shlex.quote(spec.cluster)}",
        f"export CORRAL_NUM_GPUS_PER_NODE={spec.gpus_per_node}",
        *node_env_lines('"$SLURM_JOB_NODELIST"'),
        'scontrol show hostnames "$SLURM_JOB_NODELIST" > nodes',
        # What Slurm gave it per node (CPUs:memory in MB), to hold a later task's cpus and memory against.
        'echo "${SLURM_CPUS_ON_NODE:-0}:${SLURM_MEM_PER_NODE:-$(( ${SLURM_MEM_PER_CPU:-0} * ${SLURM_CPUS_ON_NODE:-0} ))}"'
        " > held",
        "if [ -s setup.sh ]; then",
        f"  srun --overlap {srun_label(spec.num_nodes)}--nodes={spec.num_nodes} --ntasks-per-node=1 "
        'bash task.sh "$CORRAL_RUN_DIR/setup.sh" ""',
        '  rc=$?; if [ "$rc" -ne 0 ]; then echo "corral: setup failed ($rc)"; echo "$rc" > setup_failed; exit "$rc"; fi',
        "fi",
        "# Editors' remote-SSH needs a real sshd on the head node (see session_proxy_script).",
        "if command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ]; then touch sshd_ok; fi",
        "date +%s > last_active",
        "touch ready",
        f"idle_limit={int(idle_seconds)}",
        "while true; do",
        f"  # `corral autostop` changes the limit: {IDLE_LIMIT_FILE} (seconds; 0: never).",
        f'  [ -s {IDLE_LIMIT_FILE} ] && read -r idle_limit < {IDLE_LIMIT_FILE}',
        '  poll=15; if [ "$idle_limit" -gt 0 ] && [ "$idle_limit" -lt 45 ]; then poll=$(( (idle_limit + 2) / 3 )); fi',
        '  sleep "$poll"',
        f'  if [ -e "$CORRAL_RUN_DIR/{CANCEL_MARKER}" ] || [ ! -d "$CORRAL_RUN_DIR" ]; then',
        '    echo "corral: released (corral down)"; exit 0',
        "  fi",
        "  # Any step but the holder's own (batch, extern) is an exec job or an ssh session.",
        '  if squeue -h -s -j "$SLURM_JOB_ID" -o %i 2>/dev/null | grep -qv -e "\\.batch$" -e "\\.extern$"; then',
        "    date +%s > last_active",
        '  elif [ "$idle_limit" -gt 0 ] && [ $(( $(date +%s) - $(cat last_active) )) -ge "$idle_limit" ]; then',
        '    echo "corral: idle for ${idle_limit}s: releasing the allocation"; echo idle > ended; exit 0',
        "  fi",
        "done",
    ]
    return "\n".join(lines) + "\n"


def holder_submit_script(spec: SlurmJobSpec, idle_seconds: int, envs: dict[str, str], setup: str | None,
                         session_keys: SessionKeys) -> str:
    files = {"job.sbatch": holder_sbatch(spec, idle_seconds), "task.sh": TASK_SH, "env.sh": render_env(envs),
             "setup.sh": setup or "", f"{SESSION_DIR}/host_key": session_keys.host_private_key,
             f"{SESSION_DIR}/authorized_keys": session_keys.authorized_key,
             f"{SESSION_DIR}/proxy.sh": session_proxy_script(spec.task_ids[0], spec.cluster, sorted(envs))}
    wrapper = container_script(spec)  # task.sh runs setup and every exec through it; shell_command too
    if wrapper is not None:
        files[CONTAINER_FILE] = wrapper
    return submit_script(spec, files, job_name=DEV_PREFIX + spec.token)


SESSION_DIR = "sshd"
_PASSED_PATTERNS = "SLURM_*|CUDA_VISIBLE_DEVICES|GPU_DEVICE_ORDINAL|ROCR_VISIBLE_DEVICES|CORRAL_*|SKYPILOT_*"


def session_proxy_script(name: str, cluster: str, env_names: list[str]) -> str:
    """Serves one ssh connection inside the allocation: `sshd -i` as the user, speaking SSH on the
    step's stdin/stdout. An ssh `ProxyCommand` runs it through the login node with `srun -u`, so the
    client talks to a real sshd on the head node: port forwarding, sftp and remote commands all work,
    which editors' remote-SSH needs, without the compute node being reachable or an sshd port open."""
    names = " ".join(env_names)
    return f"""\
# Written by Corral: one ssh session in dev allocation {name} (sshd -i on this step's stdin/stdout).
d=$(cd "$(dirname "$0")" && pwd)
run=$(dirname "$d")
sshd=$(command -v sshd 2>/dev/null)
if [ -z "$sshd" ] && [ -x /usr/sbin/sshd ]; then sshd=/usr/sbin/sshd; fi
if [ -z "$sshd" ]; then
  echo "corral: no sshd on $(hostname): \\`corral ssh {name}\\` works without it; editors' remote-SSH does not" >&2
  exit 1
fi
export CORRAL_RUN_DIR="$run" CORRAL_TASK_ID={shlex.quote(name)} CORRAL_CLUSTER={shlex.quote(cluster)}
extra=" {names} "
setenv=""
tmp=$(mktemp "$d/session.env.XXXXXX")
envbin=$(command -v env)
while IFS= read -r -d '' kv; do
  key=${{kv%%=*}}
  case "$key" in {_PASSED_PATTERNS}) ;; *) case "$extra" in *" $key "*) ;; *) continue;; esac;; esac
  printf 'export %s=%q\\n' "$key" "${{kv#*=}}"
  case "$kv" in *'"'*|*'\\'*|*$'\\n'*) continue;; esac
  setenv="$setenv \\"$kv\\""
done < <(. "$run/env.sh"; exec "$envbin" -0) > "$tmp"  # the task's envs, read in a subshell only
mv -f "$tmp" "$d/session.env"
options=(-f /dev/null -o HostKey="$d/host_key" -o AuthorizedKeysFile="$d/authorized_keys" -o PidFile=none
         -o UsePAM=no -o LogLevel=ERROR -o X11Forwarding=no -o PermitUserEnvironment=no
         -o "Subsystem sftp internal-sftp")
# SetEnv needs OpenSSH 8.7; older sshd still serves the session, and $d/session.env has the variables.
if [ -n "$setenv" ] && "$sshd" -t "${{options[@]}}" -o "SetEnv$setenv" 2>/dev/null; then
  options+=(-o "SetEnv$setenv")
fi
exec "$sshd" -i -e "${{options[@]}}"
"""


def session_proxy_command(name: str, job_id: str, head_node: str, run_dir: str) -> str:
    """The login-node command that starts one ssh session's sshd as a step on the head node."""
    _check_id(job_id)
    checked(_NODE_NAME, head_node, "a node name")
    gone = shlex.quote(f"corral: dev allocation {name} (Slurm job {job_id}) is not running; see `corral status {name}`")
    # -u: unbuffered step I/O, or slurmstepd holds SSH packets back waiting for a newline.
    script = (f'if [ "$(squeue -h -j {job_id} -o %T 2>/dev/null)" != RUNNING ]; then echo {gone} >&2; exit 1; fi; '
              f"exec srun -u --jobid={job_id} --overlap --nodes=1 --ntasks=1 -w {head_node} "
              f'bash "$HOME"/{shlex.quote(run_dir)}/{SESSION_DIR}/proxy.sh')
    return login_shell_line(script)


def exec_step_name(exec_id: str) -> str:
    """The name of an exec's srun step, by which `cancel_exec_script` finds it."""
    return f"{JOB_NAME_PREFIX}exec-{check_exec_id(exec_id)}"


def exec_script(run_dir: str, job_id: str, exec_id: str, num_nodes: int, gpus_per_node: int, cluster: str,
                envs: dict[str, str], run: str, setup: str = "", gpus_claimed: int = 0) -> str:
    """Run `run` on the allocation's first `num_nodes` nodes (all of them, usually) as one step named
    for the exec, from the login node; with `setup`, first that on every node of the allocation, as a
    step of the same name (so that `cancel_exec_script` ends either), and `run` only if it succeeded.
    With `gpus_claimed`, the exec first takes that many of the `gpus_per_node` the allocation holds
    (waiting while other execs hold them) and its steps see only those (`claim_gpus`); else all.

    Their stdout and stderr, merged as in a job's log, go both to the caller and to the exec's `output`
    file in the allocation (what `corral logs` shows later); `ended` is left however the script ends.
    `--quiet`: srun's informational lines (`_step_signal: Terminating StepId=…` after a failure) stay out
    of the output; its errors stay in. It exits with the status of a node whose command failed by
    itself. With `--kill-on-bad-exit` the
    first failure ends the other nodes (143), and srun's own status is whichever it saw last, so each
    node records its command's status and the lowest rank's own failure wins. srun reads nothing: its
    stdin is this script, which must go on after it."""
    _check_id(job_id)
    exec_dir = exec_folder(exec_id)
    files = {f"{exec_dir}/cmd.sh": run, f"{exec_dir}/run.sh": _node_wrapper(exec_dir, "cmd.sh", "rc"),
             f"{exec_dir}/env.sh": render_env(envs)}
    if setup:
        files |= {f"{exec_dir}/setup-cmd.sh": setup,
                  f"{exec_dir}/setup.sh": _node_wrapper(exec_dir, "setup-cmd.sh", "setup-rc")}
    out = (
        write_files_script(run_dir, files)
        + 'cd "$d" || exit 1\n'
        + f'state=$(squeue -h -j {job_id} -o %T 2>/dev/null)\n'
        + 'if [ "$state" != RUNNING ] || [ ! -e ready ]; then '
        + 'echo "corral: the allocation is not ready (${state:-gone})" >&2; exit 75; fi\n'
        + exec_ended_trap(f'"$d"/{exec_dir}')
        + stop_if_cancelled(f'"$d"/{exec_dir}')
        + 'export CORRAL_RUN_DIR="$d"\n'
        + f"export CORRAL_TASK_ID={shlex.quote(exec_id)} CORRAL_CLUSTER={shlex.quote(cluster)}\n"
        + f"export CORRAL_NUM_GPUS_PER_NODE={gpus_per_node}\n"
        + (claim_gpus(exec_id, gpus_claimed, gpus_per_node,
                      f'[ "$(squeue -h -j {job_id} -o %T 2>/dev/null)" = RUNNING ]') if gpus_claimed else "")
        + f'all=$(scontrol show hostnames "$(squeue -h -j {job_id} -o %N)")\n'
        + f'nodes=$(echo "$all" | head -n {num_nodes} | paste -sd, -)\n'
        + "\n".join(node_env_lines('"$nodes"')) + "\n"
    )
    if setup:
        out += (
            'count=$(echo "$all" | wc -l)\n'
            + _exec_step(job_id, exec_id, '"$count"', '$(echo "$all" | paste -sd, -)', "setup.sh",
                         "-a " if gpus_claimed else "")
            + _own_failure(exec_dir, "setup-rc", "$((count - 1))", 'status=$rc; break')
            + stop_if_cancelled(f'"$d"/{exec_dir}')
            + f'if [ "$status" -ne 0 ]; then echo "{EXEC_SETUP_FAILED} with exit code $status; the run did not start" '
            + f'| tee -a "$d/{exec_dir}/{EXEC_OUTPUT}"; exit "$status"; fi\n'
        )
        if not run:
            return out + "exit 0\n"
    return (
        out
        # appended to what came before: setup's output, or the line saying it waited for GPUs
        + _exec_step(job_id, exec_id, str(num_nodes), "$nodes", "run.sh", "-a " if setup or gpus_claimed else "")
        + _own_failure(exec_dir, "rc", str(num_nodes - 1), 'exit "$rc"')
        + 'exit "$status"\n'
    )


def _node_wrapper(exec_dir: str, command_file: str, rc_file: str) -> str:
    """What runs on each node of an exec's step: the command, then its status into `rc_file`.<rank>;
    nothing if the exec was cancelled before the step began (see `cancel_exec_script`)."""
    return (stop_if_cancelled(f'"$CORRAL_RUN_DIR"/{exec_dir}') + narrow_gpus()
            + f'"$BASH" "$CORRAL_RUN_DIR"/{exec_dir}/{command_file}; rc=$?\n'
            f'echo "$rc" > "$CORRAL_RUN_DIR"/{exec_dir}/{rc_file}."$SLURM_NODEID"\nexit "$rc"\n')


def _own_failure(exec_dir: str, rc_file: str, last_rank: str, then: str) -> str:
    """Bash that runs `then` for the lowest rank whose command failed by itself (its status in `rc`),
    not by a signal (128-299: ended for another node's failure, or cancelled)."""
    return (f'for rank in $(seq 0 {last_rank}); do rc=$(cat "$d/{exec_dir}/{rc_file}.$rank" 2>/dev/null); '
            f'case "$rc" in ""|0|12[89]|1[3-9][0-9]|2[0-9][0-9]) ;; *) {then} ;; esac; done\n')


def _exec_step(job_id: str, exec_id: str, count: str, nodes: str, wrapper: str, tee_flags: str) -> str:
    """One srun step of an exec on `nodes` (`count` of them), its output to the caller and the exec's
    output file; leaves `status`."""
    exec_dir = exec_folder(exec_id)
    return (f'srun --quiet {srun_label(count)}--jobid={job_id} --overlap --job-name={exec_step_name(exec_id)} '
            f'--nodes={count} -w "{nodes}" --ntasks-per-node=1 --kill-on-bad-exit=1 '
            f'bash task.sh "" "$d/{exec_dir}/{wrapper}" "$d/{exec_dir}/env.sh" </dev/null 2>&1 '
            f'| tee -p {tee_flags}"$d/{exec_dir}/{EXEC_OUTPUT}"\n'
            'status=${PIPESTATUS[0]}\n')


def exec_output_script(run_dir: str, job_id: str, exec_id: str, follow: bool, tail: int = 0) -> str:
    """Print what an exec showed (with `tail` > 0, its last `tail` lines); with `follow`, until it has
    ended (its `ended` marker) or its allocation has (checked every 10 s: one squeue, not one a second)."""
    _check_id(job_id)
    folder = f'"$HOME"/{shlex.quote(run_dir)}/{exec_folder(exec_id)}'
    lines = tail_lines(tail)
    if not follow:
        return f"tail {lines} -- {folder}/{EXEC_OUTPUT} 2>/dev/null; exit 0\n"
    return (
        f"e={folder}; n=0\n"
        f'alive() {{ [ ! -e "$e/{EXEC_ENDED}" ] || return 1; n=$((n + 1)); [ $((n % 10)) -ne 1 ] || '
        f"squeue -h -j {job_id} -t R -o %T 2>/dev/null | grep -q .; }}\n"
        # Its files may still be syncing; one that never comes (the exec failed first) is waited for
        # EXEC_START_WAIT seconds at most.
        f'while [ ! -e "$e/{EXEC_OUTPUT}" ] && [ "$n" -lt {EXEC_START_WAIT} ] && alive; do sleep 1; done\n'
        f'[ -e "$e/{EXEC_OUTPUT}" ] || exit 0\n'
        f'tail {lines} -F -- "$e/{EXEC_OUTPUT}" 2>/dev/null & t=$!\n'
        "while alive; do sleep 1; done\n"
        "sleep 1; kill $t 2>/dev/null; wait $t 2>/dev/null; exit 0\n"
    )


def cancel_exec_script(run_dir: str, job_id: str, exec_id: str) -> str:
    """End an exec, not the allocation (the holder job goes on): leave the cancel marker in its folder,
    then scancel its steps (found by their name). An exec between its setup and run steps, or not yet in
    its first, finds the marker and starts no other step; a step that had begun before the marker was
    left is already known to Slurm when this asks, as it is created before its tasks look."""
    _check_id(job_id)
    run = f'"$HOME"/{shlex.quote(run_dir)}'
    folder = f"{run}/{exec_folder(exec_id)}"
    return (leave_cancel_marker(run, folder)
            + f"squeue -h -s -j {job_id} -o '%i|%j' 2>/dev/null | "
            f"awk -F'|' '$2 == \"{exec_step_name(exec_id)}\" {{print $1}}' | xargs -r scancel\nexit 0\n")


def setup_output_script(run_dir: str, job_id: str) -> str:
    """Print the holder's log from its start as it comes (its setup's output), until the holder is
    ready or its setup failed, or it has ended (one squeue every 5 s; a pending holder waits)."""
    _check_id(job_id)
    return (
        f'd="$HOME"/{shlex.quote(run_dir)}; n=0\n'
        'over() { { [ -e "$d/ready" ] || [ -e "$d/setup_failed" ]; } && return 0; n=$((n + 1)); '
        '[ $((n % 5)) -eq 1 ] || return 1; '
        f'! squeue -h -j {job_id} -o %T 2>/dev/null | grep -q -e PENDING -e RUNNING -e CONFIGURING; }}\n'
        + follow_log_until_over(1)
    )


_HOLDER_SETUP_FAILED = re.compile(r"^corral: setup failed \(\d+\)$")


def status_script(allocations: list[tuple[str, str]]) -> str:
    """For (job id, run dir) pairs: Slurm's view and the holder's own files, in one round trip."""
    out = [CLOCK.rstrip("\n")]
    for job_id, _ in allocations:
        _check_id(job_id)
    # All of the user's jobs, not `-j ids`: squeue refuses the whole list if one id was purged.
    out.append(f"printf '\\n{MARK} squeue 0\\n'")
    out.append("squeue --me -h -t all -O 'JobID:0|,State:0|,Reason:0|,TimeLeft:0|,StartTime:0|,"
               "NodeList:0' 2>/dev/null")
    for job_id, run_dir in allocations:
        path = f'"$HOME"/{shlex.quote(run_dir)}'
        out.append(f"printf '\\n{MARK} files-{job_id} 0\\n'")
        out.append(f"for f in ready last_active ended setup_failed nodes sshd_ok held; do if [ -e {path}/$f ]; then "
                   f"printf '%s=%s\\n' \"$f\" \"$(paste -sd, {path}/$f)\"; fi; done")
        out.append(f"for f in {path}/exec/*/{EXEC_ENDED}; do [ -s \"$f\" ] && printf 'exec=%s:%s\\n' "
                   f"\"$(basename \"${{f%/*}}\")\" \"$(head -c 12 \"$f\")\"; done")
        # A failed setup's last lines (its output is the holder's log): what says why.
        out.append(f"if [ -e {path}/setup_failed ]; then printf '\\n{MARK} setup-{job_id} 0\\n'; "
                   f"tail -n {SETUP_TAIL_LINES} {path}/log.txt 2>/dev/null | cut -c1-300; fi")
    return "\n".join(out) + "\nexit 0\n"


def idle_limit_script(run_dir: str, idle_seconds: int) -> str:
    """Give a live holder a new idle limit (0: never), counted from now (each file replaced whole: the
    holder reads them as it polls)."""
    return (f'd="$HOME"/{shlex.quote(run_dir)}\n'
            '[ -d "$d" ] || exit 0\n'
            f'echo {int(idle_seconds)} > "$d/{IDLE_LIMIT_FILE}.new" && mv -f "$d/{IDLE_LIMIT_FILE}.new" '
            f'"$d/{IDLE_LIMIT_FILE}"\n'
            'date +%s > "$d/last_active.new" && mv -f "$d/last_active.new" "$d/last_active"\n')


def down_script(job_id: str | None, run_dir: str) -> str:
    """Leave the cancel marker, scancel, remove the files: a holder whose kill is lost still ends."""
    path = f'"$HOME"/{shlex.quote(run_dir)}'
    parts = [f"[ -d {path} ] && : > {path}/{CANCEL_MARKER}"]
    if job_id:
        parts.append(f"scancel {_check_id(job_id)} 2>/dev/null")
    parts.append(f"rm -rf {path}")
    return "\n".join(parts) + "\nexit 0\n"


def shell_command(job_id: str, head_node: str, run_dir: str, command: str | None) -> str:
    """The remote command of `corral ssh`: a step on the head node, interactive or running `command`; in
    the allocation's image where it has one (its run dir's container.sh)."""
    _check_id(job_id)
    checked(_NODE_NAME, head_node, "a node name")
    base = (f'd="$HOME"/{shlex.quote(run_dir)}; inside=(); '
            f'if [ -f "$d/{CONTAINER_FILE}" ]; then export CORRAL_RUN_DIR="$d"; '
            f'inside=(bash "$d/{CONTAINER_FILE}"); fi; '
            f'exec srun --jobid={job_id} --overlap --nodes=1 --ntasks=1 -w {head_node}')
    if command is None:
        return login_shell_line(f'{base} --pty "${{inside[@]}}" bash -l')
    return login_shell_line(f'{base} "${{inside[@]}}" bash -lc {one_line_word(command)}')


_ENDED_BECAUSE = {"TIMEOUT": "walltime ended", "NODE_FAIL": "a node failed", "CANCELLED": "cancelled",
                  "PREEMPTED": "preempted", "BOOT_FAIL": "a node failed to boot"}


def parse_allocation_status(job_id: str, stdout: str) -> AllocationState:
    """One allocation's state from `status_script`'s answer: Slurm's view, the holder's files, and the
    execs that have ended in it with their exit status."""
    sections = split_sections(stdout)
    files: dict[str, str] = {}
    marker_section = sections.get(f"files-{job_id}")
    ended_execs: dict[str, int] = {}
    for line in marker_section.text.splitlines() if marker_section else []:
        key, _, value = line.partition("=")
        if key == "exec":
            exec_id, _, code = value.partition(":")
            if code.strip().isdigit():
                ended_execs[exec_id] = int(code)
        else:
            files[key] = value
    slurm = None
    squeue = sections.get("squeue")
    for line in squeue.text.splitlines() if squeue else []:
        fields = line.split(FIELD_SEPARATOR)
        if fields and fields[0] == job_id and len(fields) == 6:
            slurm = fields
    setup = sections.get(f"setup-{job_id}")
    said = [line for line in (setup.text if setup is not None else "").splitlines()
            if not _HOLDER_SETUP_FAILED.match(line)]  # the holder's own line says only the exit code
    cpus, _, memory_mb = files.get("held", "").partition(":")
    state = _phase(files, slurm)
    clock = sections.get("clock")
    if state.phase is AllocationPhase.PENDING and slurm is not None and clock is not None:
        try:  # Slurm's estimate, in the cluster's local time: its clock turns it into an epoch
            state = dataclasses.replace(state, expected_start=parse_clock(clock.text).to_epoch(slurm[4]))
        except ValueError:
            pass
    return dataclasses.replace(state, ended_execs=ended_execs, setup_output="\n".join(said),
                               cpus_per_node=int(cpus) if cpus.isdigit() and int(cpus) else None,
                               memory_mb_per_node=int(memory_mb) if memory_mb.isdigit() and int(memory_mb) else None)


def _phase(files: dict[str, str], slurm: list[str] | None) -> AllocationState:
    nodes = files["nodes"].split(",") if files.get("nodes") else []
    last_active = float(files["last_active"]) if files.get("last_active", "").isdigit() else None
    if slurm is None:
        return AllocationState(AllocationPhase.ENDED, "Slurm no longer knows the job", nodes, last_active, None)
    _, state, reason, time_left, _start, _nodelist = slurm
    generic = STATE_MAP.get(state)
    reason = None if reason in ("None", "") else reason
    if generic is not None and generic.value in ("RUNNING", "STARTING"):
        ready = "ready" in files
        return AllocationState(AllocationPhase.READY if ready else AllocationPhase.STARTING,
                               None if ready else "running setup", nodes, last_active, time_left,
                               sshd="sshd_ok" in files)
    if generic is not None and generic.value == "PENDING":
        return AllocationState(AllocationPhase.PENDING, reason, [], None, time_left)
    why = _ENDED_BECAUSE.get(state, state.lower())
    if files.get("ended") == "idle":
        why = "released after being idle"
    if "setup_failed" in files:
        why = f"setup failed with exit code {files['setup_failed']}"
    failed = state in ("NODE_FAIL", "BOOT_FAIL", "FAILED") or "setup_failed" in files
    return AllocationState(AllocationPhase.FAILED if failed else AllocationPhase.ENDED, why, nodes, last_active, None)
