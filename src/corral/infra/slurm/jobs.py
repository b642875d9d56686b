"""Job operations on one Slurm cluster, each one SSH round trip: predict, submit, status, cancel, logs."""

from __future__ import annotations

import functools
import math
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from corral.errors import ProbeParseError
from corral.infra.base import (
    FailureClass,
    JobRequest,
    JobState,
    JobStatus,
    SubmitResult,
)
from corral.infra.shell import checked, remove_script, tail_lines
from corral.infra.slurm import userscript
from corral.infra.slurm.jobscript import (
    CANCEL_MARKER,
    JOB_NAME_PREFIX,
    RUNS_DIR,
    STEP_COMMENT_PREFIX,
    sbatch_options,
    spec_for,
)
from corral.infra.slurm.parsing import FIELD_SEPARATOR, format_spec
from corral.infra.slurm.probe import MARK, SCRATCH, scratch_failure, split_sections

_START_AT = re.compile(r"to start at (\S+)")
_JOB_ID = re.compile(r"^\d+(_\d+)?\Z", re.ASCII)
_UNIX_NAME = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}\Z", re.ASCII)
CLOCK = (f"printf '{MARK} clock 0\\n'; date +%s; date +%Y-%m-%dT%H:%M:%S\n")

# Slurm job states → the generic ones.
_P, _S, _R = JobState.PENDING, JobState.STARTING, JobState.RUNNING
STATE_MAP: dict[str, JobState] = {
    "PENDING": _P, "REQUEUED": _P, "REQUEUE_HOLD": _P, "REQUEUE_FED": _P, "RESV_DEL_HOLD": _P,
    "CONFIGURING": _S, "RUNNING": _R, "COMPLETING": _R, "SUSPENDED": _R, "STOPPED": _R, "SIGNALING": _R,
    "STAGE_OUT": _R, "RESIZING": _R, "COMPLETED": JobState.SUCCEEDED, "CANCELLED": JobState.CANCELLED,
    "REVOKED": JobState.CANCELLED, "FAILED": JobState.FAILED, "TIMEOUT": JobState.FAILED,
    "NODE_FAIL": JobState.FAILED, "BOOT_FAIL": JobState.FAILED, "PREEMPTED": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED, "DEADLINE": JobState.FAILED, "SPECIAL_EXIT": JobState.FAILED,
}
# Failed states that are the infrastructure's doing, not the task's: the controller recovers these.
INFRA_FAILURE_STATES = frozenset({"NODE_FAIL", "BOOT_FAIL", "PREEMPTED"})
# FAILED for these reasons, Slurm could not start the batch script at all (a node's filesystem or
# slurmd, a dispatch never confirmed): the infrastructure's failure for the scripts Corral writes,
# whose output paths and options are its own. A user's own job script stays the task's: its
# `#SBATCH --output` into a missing directory fails the same way, on every cluster.
INFRA_FAILURE_REASONS = frozenset({"JobLaunchFailure", "SystemFailure"})
# A job's name is the user's own text for a job script (it may hold the separator): second, so that a
# line splits once from the left for the id, then from the right; the comment, last, is Corral's word.
SQUEUE_FIELDS = ("JobArrayID", "Name", "State", "Reason", "SubmitTime", "StartTime", "EndTime", "exit_code",
                 "Partition", "Comment")
SACCT_FIELDS = "JobID,JobName,State,Reason,Submit,Start,End,ExitCode,Partition,Comment"


_REJECTED = "sbatch rejected the job"


@dataclass(frozen=True)
class Clock:
    """The cluster's clock: Slurm prints local times without a zone."""

    epoch: float
    local: datetime

    def to_epoch(self, text: str) -> float | None:
        text = text.strip()
        if not text or text in ("N/A", "Unknown", "None", "(null)"):
            return None
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            return None
        return self.epoch + (when - self.local).total_seconds()

    @property
    def offset(self) -> float:
        """Seconds from the cluster's local time to UTC: a local time's epoch is it plus this."""
        return self.epoch - (self.local - _EPOCH).total_seconds()


_EPOCH = datetime(1970, 1, 1)


def parse_clock(text: str) -> Clock:
    lines = text.split()
    if len(lines) < 2:
        raise ValueError(f"no clock in {text!r}")
    return Clock(float(lines[0]), datetime.fromisoformat(lines[1]))


def test_only_script(requests: list[JobRequest], cluster: str) -> str:
    """`sbatch --test-only` for several candidates at once, in parallel (a job script as rewritten for
    the cluster, Corral's own jobs with their options and a `--wrap`)."""
    out = [CLOCK + SCRATCH]
    scripts = [i for i, r in enumerate(requests) if userscript.is_script_request(r)]
    out += userscript.test_only_lines([requests[i] for i in scripts], cluster, scripts)
    for i, request in enumerate(requests):
        if i in scripts:
            continue
        opts = " ".join(shlex.quote(o) for o in sbatch_options(spec_for(request, cluster)))
        out.append(f"( cd /tmp && timeout 20 sbatch --test-only {opts} --wrap true >\"$d/{i}\" 2>&1 ) &")
    out.append("wait")
    out += [f"printf '\\n{MARK} test{i} 0\\n'; cat \"$d/{i}\"" for i in range(len(requests))]
    return "\n".join(out) + "\n"


def parse_test_only(stdout: str, count: int) -> list[tuple[float | None, str]]:
    """(predicted start in epoch seconds or None, Slurm's words) for each candidate."""
    sections = split_sections(stdout)
    clock = parse_clock(sections["clock"].text)
    no_scratch = scratch_failure(sections)
    out = []
    for i in range(count):
        text = sections.get(f"test{i}")
        words = " ".join(text.text.split()) if text else no_scratch or "no answer"
        match = _START_AT.search(words)
        out.append((clock.to_epoch(match.group(1)) if match else None, words))
    return out


def parse_submit(stdout: str) -> SubmitResult:
    for i, line in enumerate(stdout.splitlines()):
        if line.startswith(f"{MARK} submitted "):
            parts = line.split()
            return SubmitResult(True, parts[2], len(parts) > 3 and parts[3] == "existing", "")
        if line.startswith(f"{MARK} rejected"):
            if line.split()[2:] == ["busy"]:
                return SubmitResult(False, None, False, f"{_REJECTED}: Slurm is not accepting jobs now (sbatch: "
                                    "\"Slurm temporarily unable to accept job\"): its job table is full "
                                    "(MaxJobCount) or the controller is overloaded")
            message = " ".join(stdout.splitlines()[i + 1:]).strip()
            return SubmitResult(False, None, False,
                                f"{_REJECTED}: {message.removeprefix('sbatch: error: ') or 'sbatch failed'}")
    raise ProbeParseError("?", f"unexpected answer from sbatch: {stdout.strip()[-300:]!r}")


def status_script(tracked_ids: list[str], with_sacct: bool = True, accounts: Sequence[str] = (),
                  unless_unchanged: str | None = None, ping_within: int | None = None) -> str:
    """All of the user's jobs (and the other `accounts`' jobs: a team's members) from one squeue; sacct
    (if the site has it) for tracked ids squeue forgot.

    With `unless_unchanged` (the digest of the last light answer, or "" for none yet), first the light
    query (`light_lines`): when the tracked jobs' ids and states hash to that digest, the script ends
    there, and squeue's full query and sacct do not run.

    With `ping_within` (seconds; after a status query that failed), `scontrol ping` goes first and the
    script ends there unless a controller is UP: against a stopped slurmctld the ping says DOWN in
    milliseconds, where squeue retries for 8 s before it gives up."""
    for job_id in tracked_ids:
        checked(_JOB_ID, job_id, "a Slurm job id")
    for account in accounts:
        checked(_UNIX_NAME, account, "a Unix account name")
    ids = " ".join(tracked_ids)
    # The connection's own account, by name: `--me` and `-u` do not combine.
    users = f"-u \"$(id -un)\"{''.join(',' + a for a in accounts)}" if accounts else "--me"
    lines = [
        CLOCK,
        *(ping_lines(ping_within) if ping_within is not None else ()),
        *(light_lines(ids, unless_unchanged) if unless_unchanged is not None else ()),
        f"sq=$(squeue {users} -h -r -t all -O '{format_spec(SQUEUE_FIELDS)}' 2>&1); rc=$?",
        f"printf '\\n{MARK} squeue %s\\n%s\\n' \"$rc\" \"$sq\"",
    ]
    if with_sacct and tracked_ids:
        # Ids squeue no longer shows (one awk pass, not a loop per id); sacct for those, if the site has it.
        lines += [
            "if command -v sacct >/dev/null 2>&1; then",
            "  missing=$(printf '%s\\n' \"$sq\" | awk -F'|' -v ids=" + shlex.quote(ids) + " "
            "'{seen[$1]=1} END {n=split(ids, a, \" \"); for (i=1; i<=n; i++) if (!(a[i] in seen)) printf \"%s,\", a[i]}')",
            '  if [ -n "$missing" ]; then',
            f"    printf '\\n{MARK} sacct 0\\n'",
            f"    sacct {users if accounts else ''} -X -n -P -j \"${{missing%,}}\" -o {SACCT_FIELDS} 2>&1"
            " | grep -v 'accounting storage is disabled'",
            "  fi",
            "fi",
        ]
    # The statuses are in the sections; a filter that found nothing must not fail the call.
    return "\n".join(lines) + "\nexit 0\n"


def ping_lines(seconds: int) -> list[str]:
    """`scontrol ping` (its section), and the end of the script unless it names a controller UP."""
    return [
        f"ping=$(timeout {int(seconds)} scontrol ping 2>&1); prc=$?",
        f"case \"$ping\" in *\" is UP\"*) ;; *) printf '\\n{MARK} ping %s\\n%s\\n' \"$prc\" \"$ping\"; exit 0 ;; esac",
    ]


def stopped_at_ping(stdout: str) -> bool:
    """Did a status query end at its ping (no controller UP)?"""
    return "ping" in split_sections(stdout)


_DIGEST = re.compile(r"^[0-9a-f]{32}\Z")


def light_lines(ids: str, last_digest: str) -> list[str]:
    """`squeue --only-job-state` (Slurm's light RPC: job ids and states only, without the job records
    a full query packs), cut to the tracked jobs, as a digest; the script ends if it is `last_digest`.
    Its section: the digest, or squeue's complaint (an older Slurm does not know the option)."""
    if last_digest:
        checked(_DIGEST, last_digest, "a digest")
    keep = ("'BEGIN {n=split(ids, a, \" \"); for (i=1; i<=n; i++) {split(a[i], b, /[_+]/); want[b[1]]=1}} "
            "{split($1, p, /[_+]/)} (p[1] in want)'")
    return [
        "lq=$(squeue --only-job-state -h -o '%i|%T' 2>&1); lrc=$?",
        'if [ "$lrc" -eq 0 ]; then',
        f"  ld=$(printf '%s\\n' \"$lq\" | awk -F'|' -v ids={shlex.quote(ids)} {keep} | LC_ALL=C sort | md5sum | cut -c1-32)",
        f"  printf '\\n{MARK} light 0\\n%s\\n' \"$ld\"",
        f'  [ -n "$ld" ] && [ "$ld" = {shlex.quote(last_digest) if last_digest else "-"} ] && exit 0',
        "else",
        f"  printf '\\n{MARK} light %s\\n%s\\n' \"$lrc\" \"$(printf '%s\\n' \"$lq\" | tail -n 2)\"",
        "fi",
    ]


def _exit_code(raw: str) -> int | None:
    raw = raw.strip()
    if ":" in raw:  # sacct: "3:0" (code:signal)
        code, _, signal = raw.partition(":")
        if signal.isdigit() and int(signal):
            return 128 + int(signal)
        return int(code) if code.isdigit() else None
    if raw.isdigit():  # squeue: the raw wait status
        status = int(raw)
        return 128 + (status & 0x7F) if status & 0x7F else status >> 8
    return None


def _fields(line: str) -> list[str] | None:
    """A status line's fields, the job name whole whatever it holds; None for a line that is not one."""
    job_id, sep, rest = line.partition(FIELD_SEPARATOR)
    fields = [job_id, *rest.rsplit(FIELD_SEPARATOR, len(SQUEUE_FIELDS) - 2)] if sep else []
    return fields if len(fields) == len(SQUEUE_FIELDS) else None


def _het_leader(fields: list[str]) -> list[str] | None:
    """A heterogeneous job's components show as `123+0`, `123+1`, …: the job is its first component,
    under the id sbatch gave (`123`); the others are left out."""
    base, plus, offset = fields[0].partition("+")
    if not plus:
        return fields
    return [base, *fields[1:]] if offset.strip() == "0" else None


def _token(name: str, comment: str) -> str | None:
    """The attempt token on a job: in its comment for a user's job script, in its name for Corral's own."""
    if comment.startswith(userscript.COMMENT_PREFIX):
        return comment[len(userscript.COMMENT_PREFIX):]
    return name[len(JOB_NAME_PREFIX):] if name.startswith(JOB_NAME_PREFIX) else None


def _status(fields: list[str], to_epoch: Callable[[str], float | None]) -> JobStatus:
    job_id, name, state, reason, submit, start, end, exit_raw, _partition, comment = map(str.strip, fields)
    slurm_state = state.split()[0].rstrip("+") if state else "UNKNOWN"
    token = _token(name, comment)
    generic = STATE_MAP.get(slurm_state, JobState.UNKNOWN)
    ended = generic not in (JobState.PENDING, JobState.STARTING, JobState.RUNNING)
    failure = None
    if generic is JobState.FAILED:
        corral_script = name.startswith(JOB_NAME_PREFIX) and not comment.startswith(userscript.COMMENT_PREFIX)
        infra = slurm_state in INFRA_FAILURE_STATES or (corral_script and reason in INFRA_FAILURE_REASONS)
        failure = FailureClass.INFRA if infra else FailureClass.TASK
    if comment.startswith(STEP_COMMENT_PREFIX) and ended:
        # The step-start bound ended it (jobscript.step_bound_lines): the step, not the task, failed.
        generic, failure, reason = JobState.FAILED, FailureClass.INFRA, comment[len(STEP_COMMENT_PREFIX):]
    return JobStatus(
        handle=job_id,
        token=token,
        state=generic,
        native_state=slurm_state,
        reason=None if reason in ("None", "", "(null)") else reason,
        submitted_at=to_epoch(submit),
        started_at=to_epoch(start) if generic is not JobState.PENDING else None,
        expected_start=to_epoch(start) if generic is JobState.PENDING else None,
        ended_at=to_epoch(end) if ended else None,
        exit_code=_exit_code(exit_raw) if ended else None,
        failure=failure,
    )


@dataclass
class StatusLines:
    """What the last status query's squeue lines parsed to, kept by the cluster's Infra between queries.
    From one tick to the next most of a queue's lines are the same, byte for byte (10,000 jobs held or
    running): those are looked up, not parsed again. A line's status depends only on the line and on
    the cluster clock's offset from UTC, so a new offset starts afresh."""

    offset: float | None = None
    parsed: dict[str, JobStatus] = field(default_factory=dict)
    # The light query (light_lines): whether the site's squeue has it (None: not known yet), the digest
    # it gave with the last full query, the statuses that query found, and when it ran (monotonic).
    light: bool | None = None
    digest: str = ""
    statuses: list[JobStatus] = field(default_factory=list)
    full_at: float = -math.inf
    light_only: bool = False  # the last answer was the light query's alone: nothing had changed
    failed: bool = False  # the last query failed: the next pings the controller first (ping_lines)


_STATUS_LINES: dict[tuple[str, str], StatusLines] = {}


def status_lines_for(cluster: str, account: str) -> StatusLines:
    """The StatusLines of a cluster's queries as `account` ("": as the ssh config says), one per process:
    the server makes a Client, and so an Infra, per API request, and they share what the last query
    parsed, what the site's squeue knows and whether that query failed."""
    return _STATUS_LINES.setdefault((cluster, account), StatusLines())


def parse_status(cluster: str, stdout: str, lines: StatusLines | None = None, now: float = 0.0,
                 asked: str | None = None) -> list[JobStatus]:
    """The statuses in a status query's output; `lines`: the last query's, reused and then replaced
    (`now`: the monotonic time of this answer, kept for a full query). An answer that stopped after the
    light query (`asked`: the digest its script compared with; by default the one in `lines`) is the
    statuses of the last full one, which a query answered meanwhile may have made newer."""
    sections = split_sections(stdout)
    ping = sections.get("ping")
    if ping is not None:  # only there when no controller is UP (ping_lines)
        from corral.errors import SlurmControllerError

        said = " | ".join(ping.text.splitlines()[-2:]) or f"no answer (exit status {ping.status})"
        raise SlurmControllerError(cluster, f"its Slurm controller does not answer: scontrol ping: {said}")
    light = sections.get("light")
    if lines is not None:
        lines.light_only = False
        if light is not None and light.status == 0:
            lines.light = True
            if "squeue" not in sections and "clock" in sections \
                    and light.text.strip() == (lines.digest if asked is None else asked):
                lines.light_only = True
                return list(lines.statuses)
        elif light is not None and "only-job-state" in light.text:
            lines.light = False  # this squeue does not know the option (Slurm before it)
    if "clock" not in sections or "squeue" not in sections:
        raise ProbeParseError(cluster, "the status query's output is incomplete")
    clock = parse_clock(sections["clock"].text)
    to_epoch = functools.lru_cache(maxsize=4096)(clock.to_epoch)  # a sweep's copies share their times
    squeue = sections["squeue"]
    if squeue.status != 0:
        from corral.errors import SlurmControllerError

        raise SlurmControllerError(cluster, f"squeue failed: {' | '.join(squeue.text.splitlines()[-2:])}")
    offset = clock.offset
    known = lines.parsed if lines is not None and lines.offset == offset else {}
    parsed: dict[str, JobStatus] = {}
    out = []
    for line in squeue.text.splitlines():
        status = known.get(line)
        if status is None and (fields := _fields(line)) is not None and (fields := _het_leader(fields)) is not None:
            status = _status(fields, to_epoch)
        if status is not None:
            parsed[line] = status
            out.append(status)
    seen = {s.handle for s in out}
    sacct = sections.get("sacct")
    for line in sacct.text.splitlines() if sacct else []:
        if (fields := _fields(line)) is not None and (fields := _het_leader(fields)) is not None \
                and fields[0] not in seen:
            out.append(_status(fields, to_epoch))
    if lines is not None:
        lines.offset, lines.parsed = offset, parsed
        lines.statuses, lines.full_at = out, now
        lines.digest = light.text.strip() if light is not None and light.status == 0 else ""
    return out


def cancel_script(job_ids: list[str], run_dirs: list[str] | None = None) -> str:
    """scancel the jobs. With their run dirs (relative to home, one per job id), first leave the
    cancel marker each job's script checks before it starts its task: a kill that reaches a node
    while the job is being launched can find nothing to kill, and the task would run anyway."""
    for job_id in job_ids:
        checked(_JOB_ID, job_id, "a Slurm job id")
    lines = []
    for job_id, run_dir in zip(job_ids, run_dirs or []):
        index = job_id.partition("_")[2]
        marker = CANCEL_MARKER + (f".{index}" if index else "")
        lines.append(f'[ -d "$HOME"/{shlex.quote(run_dir)} ] && : > "$HOME"/{shlex.quote(run_dir)}/{marker}')
    lines.append(f"scancel {' '.join(job_ids)} 2>&1 | grep -v 'already completed' ; exit 0")
    return "\n".join(lines) + "\n"


# A job's run directory as the store keeps it: `.corral/runs/` and the attempt's hex token (base.new_token).
_RUN_DIR = re.compile(rf"^{re.escape(RUNS_DIR)}/[0-9a-f]{{12}}\Z")


def remove_env_script(run_dirs: list[str]) -> str:
    """Remove each run directory's env.sh; only run directories of Corral's own shape reach the
    command line (anything else is refused, not removed), and `rm -f` of a gone one is no error."""
    return remove_script([f"{_checked_run_dir(run_dir)}/env.sh" for run_dir in run_dirs], "-f")


def remove_run_dirs_script(run_dirs: list[str]) -> str:
    """Remove each run directory whole, checked as in remove_env_script."""
    return remove_script([_checked_run_dir(run_dir) for run_dir in run_dirs], "-rf")


def _checked_run_dir(run_dir: str) -> str:
    return checked(_RUN_DIR, run_dir, "a Corral run directory")


def release_script(job_ids: list[str]) -> str:
    """`scontrol release` for held jobs (ids checked: they reach the command line)."""
    for job_id in job_ids:
        checked(_JOB_ID, job_id, "a Slurm job id")
    return f"scontrol release {' '.join(job_ids)}\n"


def follow_script(log_path: str, slurm_job_id: str, follow: bool, tail: int = 0) -> str:
    """Print a job's log (with `tail` > 0, its last `tail` lines); with `follow`, keep printing until the
    job has ended. A job script's log path is its --output pattern (absolute, or under the home), filled
    in for this job (`userscript.log_glob`)."""
    checked(_JOB_ID, slurm_job_id, "a Slurm job id")
    lines = tail_lines(tail)
    word = (userscript.log_glob(log_path, slurm_job_id) if "%" in log_path or log_path.startswith("/")
            else f'"$HOME"/{shlex.quote(log_path)}')
    find = f'shopt -s nullglob\nfind_log() {{ set -- {word}; f="${{1-}}"; }}\nfind_log\n'
    if not follow:
        return find + f'[ -n "$f" ] && tail {lines} -- "$f" 2>/dev/null; exit 0\n'
    # Not COMPLETING: the tasks are over then, and Slurm's clean-up can take a minute (a step whose
    # I/O it abandons after 60 s), which a person following a cancelled job should not wait for.
    alive = f"squeue -h -j {slurm_job_id} -t PD,CF,R,S,RQ,RS,RH,SO -o %T 2>/dev/null | grep -q ."
    return (
        find
        + f'while {{ [ -z "$f" ] || [ ! -e "$f" ]; }} && {alive}; do sleep 1; find_log; done\n'
        + '[ -n "$f" ] && [ -e "$f" ] || exit 0\n'
        + f'tail {lines} -F -- "$f" 2>/dev/null & t=$!\n'
        + f"while {alive}; do sleep 2; done\n"
        + "sleep 1; kill $t 2>/dev/null; wait $t 2>/dev/null; exit 0\n"
    )
