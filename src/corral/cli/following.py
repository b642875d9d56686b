"""Following a job to its end: its output as it comes, then how it ended, which becomes the command's
exit status (0 when it succeeded, else its own exit code, else 1), as `sky launch`, `sky logs` and
`sky jobs launch` do. Serves an attached `launch`, `logs`, an attached `jobs launch` and `jobs logs`.
API calls only (one status request a second while nothing streams); loads the SDK and click."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from corral.cli.common import handle_in, on_slurm, place_of, write_bytes
from corral.errors import CorralError
from corral.timefmt import expected_start

WAITING_STATES = frozenset({"SUBMITTING", "PENDING"})
BETWEEN_ATTEMPTS = frozenset({"RECOVERING", "CANCELLING"})  # managed states worth a line while no output comes
POLL_SECONDS = 1.0
SETTLE_SECONDS = 60  # after a job's output ends, how long Slurm may take to say how it ended


def exit_status(state: str, exit_code: int | None) -> int:
    return 0 if state == "SUCCEEDED" else (exit_code or 1)


def status_only(job: Any) -> int:
    """`logs --status`: the job's state on stdout, no output; 0 when it succeeded, EXIT_TEMPFAIL (75)
    while it has not ended, else what following it to its end gives. `job`: an SDK Job or ManagedJob."""
    from corral.errors import EXIT_TEMPFAIL

    exit_code = _exit_code(job)
    where = f" on {place(job)}" if job.cluster else ""
    code = f" ({exit_code_text(exit_code)})" if job.ended else ""
    click.echo(f"{job.job_id} {job.state}{where}{code}")
    return exit_status(job.state, exit_code) if job.ended else EXIT_TEMPFAIL


def _exit_code(job: Any) -> int | None:
    exit_code = job.raw.get("exit_code")
    if exit_code is None and job.raw.get("attempt_list"):  # a managed job's: its last attempt's
        exit_code = job.raw["attempt_list"][-1].get("exit_code")
    return exit_code  # type: ignore[no-any-return]


def wait_quietly(client: Any, job_ids: list[str], *, managed: bool = False) -> int:
    """`sbatch --wait`: until every job has ended, without their output; then one line on stderr for how
    they ended. The exit status is the highest of theirs (sbatch's for an array). Ctrl-C leaves them
    running and says how to stop them."""
    ended: list[Any] = []
    wait = client.managed_wait if managed else client.wait
    try:
        for job_id in job_ids:  # one status request a second, for the job not yet seen ended
            ended.append(wait(job_id, poll=POLL_SECONDS))
    except KeyboardInterrupt:
        left = job_ids[len(ended):]
        more = f" and {len(left) - 1} more" if len(left) > 1 else ""
        stop = "corral jobs cancel" if managed else "corral cancel"
        verb, them = ("keep", "them") if more else ("keeps", "it")
        click.echo(f"\ncorral: {left[0]}{more} {verb} running; Ctrl-C only stopped waiting. `{stop} "
                   f"{' '.join(left[:3])}{' …' if len(left) > 3 else ''}` stops {them}.", err=True)
        return 130
    statuses = [exit_status(job.state, _exit_code(job)) for job in ended]
    worst = max(range(len(ended)), key=lambda i: statuses[i])
    job = ended[worst]
    if len(ended) == 1:
        where = f" on {place(job)}" if job.cluster else ""
        code = f" (exit code {_exit_code(job)})" if _exit_code(job) is not None else ""
        apart = stderr_apart(job.job_id, getattr(job, "stderr_path", None), statuses[worst])
        click.echo(f"corral: {job.job_id} {job.state}{where}{code}{apart}", err=True)
    else:
        counts: dict[str, int] = {}
        for each in ended:
            counts[str(each.state)] = counts.get(str(each.state), 0) + 1
        states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        click.echo(f"corral: {len(ended)} jobs ended: {states}; highest exit code {_exit_code(job)} "
                   f"({job.job_id})", err=True)
    return statuses[worst]


def print_snapshot(client: Any, job_id: str, *, tail: int = 0, stderr: bool = False) -> CorralError | None:
    """`logs --no-follow`: what there is (as print_output). A job that has printed nothing because it has
    not started is said to be waiting, on stderr, with Slurm's reason, rather than left to look empty."""
    written = 0

    def counted(chunks: Any) -> Any:
        nonlocal written
        for chunk in chunks:
            written += len(chunk)
            yield chunk

    cut = print_output(counted(client.logs(job_id, tail=tail, stderr=stderr)))
    if cut is None and not written:
        job = client.job(job_id)
        if not job.ended and job.started_at is None:
            why = f" ({job.reason})" if job.reason else ""
            click.echo(f"corral: {job.job_id} is {job.state} on {place(job)}{why}: no output yet; "
                       f"`corral logs {job.job_id}` waits for it", err=True)
    return cut


def print_output(chunks: Any) -> CorralError | None:
    """Write an output stream; the error that cut it short, said on stderr (the server could not read
    on: its cluster stopped answering; sdk.OutputCutError), or None once it ended."""
    from corral.sdk import OutputCutError

    try:
        for chunk in chunks:
            write_bytes(chunk)
    except OutputCutError as exc:
        click.echo(f"corral: error: {exc}", err=True)
        return exc
    return None


def follow_to_end(client: Any, job_id: str, progress: Any, *, tail: int = 0, stderr: bool = False) -> int:
    """Wait while the job is pending (its Slurm reason and predicted start on a status line), print its
    output as it comes (with `tail`, from its last `tail` lines; `stderr`: its --error file's), then its
    end; the job's exit code. Ctrl-C leaves the job running. `job_id`: an id, or what `corral logs`
    accepts (a prefix, a name)."""
    job = None
    try:
        job = _wait_for_start(client, job_id, progress)
        job_id = job.job_id
        broken = print_output(client.logs(job_id, follow=True, tail=tail, stderr=stderr)) is not None
        return report_end(client, job_id, broken=broken, stderr_shown=stderr)
    except KeyboardInterrupt:
        progress.clear()
        job = job or _quietly(lambda: client.job(job_id))  # interrupted while it was still pending
        where = f" on {place(job)}" if job is not None and job.cluster else ""
        click.echo(f"\ncorral: {job_id} keeps running{where}; Ctrl-C only stopped following it. "
                   f"`corral logs {job_id}` follows it again, `corral cancel {job_id}` stops it.", err=True)
        return 130


def report_end(client: Any, job_id: str, *, broken: bool = False, stderr_shown: bool = False) -> int:
    """Once the job's output has ended: how the job ended (waiting while Slurm settles it), on stderr;
    its exit status. `broken`: following stopped on an error; a job still live then is not waited for
    (its cluster may be down for long): the command says so and exits 69, as for an unreachable cluster;
    one that had ended meanwhile is told as it ended. A failed job whose script sent its stderr to a
    file of its own (not `stderr_shown`) says where to read it: its traceback is there, not above."""
    from corral.errors import UnavailableError

    if broken:
        job = client.job(job_id)
        if not job.ended:
            click.echo(f"corral: stopped following {job.job_id}, still {job.state} on {place(job)} as last "
                       f"seen; `corral logs {job.job_id}` follows it again", err=True)
            return UnavailableError.exit_code
    try:
        job = client.wait(job_id, poll=POLL_SECONDS, timeout=SETTLE_SECONDS)
    except CorralError:  # still settling in Slurm: report what is known
        job = client.job(job_id)
    status = exit_status(job.state, job.exit_code)
    apart = "" if stderr_shown else stderr_apart(job.job_id, job.stderr_path, status)
    click.echo(f"corral: {job.job_id} {job.state} on {place(job)} ({exit_code_text(job.exit_code)}){apart}", err=True)
    return status


def stderr_apart(job_id: str, stderr_path: str | None, status: int) -> str:
    """For a job that failed after its script sent stderr to a file of its own (`--error`), where to
    read it (its traceback is there, not in its output); else nothing."""
    if not status or not stderr_path:
        return ""
    return f"; its stderr is in a file of its own: `corral logs --stderr {job_id}`"


def follow_managed(client: Any, job_id: str, *, follow: bool, tail: int = 0, progress: Any = None,
                   whole: bool = True) -> int:
    """A managed job's output, each attempt that reached a cluster under its own header. With `tail`,
    the current attempt's last `tail` lines only. With `follow`, the current attempt as it comes, then
    each attempt the controller starts after it (a recovery, a move), until the job ends; then how it
    ended, as the exit status (0 without `follow`). While nothing runs (an attempt pending in Slurm,
    a recovery), a status line says why. Ctrl-C stops following, not the job. A pipeline's task, once
    it has succeeded, is followed by the tasks after it, each under its own header (a job group's, by
    its other tasks); not with `whole` False (one task asked for)."""
    status, found = _follow_one(client, job_id, follow=follow, tail=tail, progress=progress)
    tasks = list(found.get("pipeline_tasks") or []) if found and follow and whole else []
    if not found or found["job_id"] not in tasks:
        return status
    if found["pipeline"].get("execution") == "parallel":
        return _follow_group(client, found, status, progress)
    name, number = found["pipeline"]["name"], tasks.index(found["job_id"])
    while status == 0 and number + 1 < len(tasks):
        number += 1
        click.echo(f"=== pipeline {name}, task {number}: {tasks[number]} ===", err=True)
        status, _ = _follow_one(client, tasks[number], follow=True, tail=0, progress=progress)
    if status == 130 and number + 1 < len(tasks):
        click.echo(f"corral: pipeline {name}'s later tasks go on as well; `corral jobs cancel {name}` cancels them "
                   "all.", err=True)
    elif status != 0 and number + 1 < len(tasks):
        click.echo(f"corral: pipeline {name} stopped at task {number}: the tasks after it are skipped", err=True)
    return status


def _follow_group(client: Any, found: dict[str, Any], status: int, progress: Any) -> int:
    """After one task of a job group, the others, each to its end under its own header: the primary
    tasks first, then the auxiliary ones (stopped once the primary ones have ended). The exit status is
    the first failed primary task's, else 0; an auxiliary task stopped by its group counts for nothing."""
    tasks, auxiliary = list(found["pipeline_tasks"]), set(found.get("pipeline_auxiliary") or [])
    name, statuses = found["pipeline"]["name"], {found["job_id"]: status}
    for task in sorted((t for t in tasks if t != found["job_id"]), key=lambda t: t in auxiliary):
        if status == 130:
            break
        click.echo(f"=== job group {name}, task {tasks.index(task)}{' (auxiliary)' if task in auxiliary else ''}: "
                   f"{task} ===", err=True)
        status, _ = _follow_one(client, task, follow=True, tail=0, progress=progress)
        statuses[task] = status
    if status == 130:
        click.echo(f"corral: job group {name}'s tasks go on; `corral jobs cancel {name}` cancels them all.", err=True)
        return 130
    return next((statuses[t] for t in tasks if t not in auxiliary and statuses.get(t)), 0)


def _follow_one(client: Any, job_id: str, *, follow: bool, tail: int, progress: Any
                ) -> tuple[int, dict[str, Any] | None]:
    """`follow_managed` for one managed job: its exit status, and the job as last read."""
    from corral.sdk.types import MANAGED_ENDED_STATES  # here, not at the top: `corral --help` loads no SDK

    progress = progress or LazyProgress()
    printed: set[int] = set()
    shown = None
    found: dict[str, Any] | None = None
    try:
        while True:
            found = client.managed_job(job_id)
            job_id = found["job_id"]  # the id, when given a prefix or a name
            new = [a for a in found["attempt_list"] if handle_in(a) and a["number"] not in printed]
            if tail and not printed:
                new = new[-1:]
            ended = found["state"] in MANAGED_ENDED_STATES
            pending = follow and not ended and bool(new) and new[-1]["state"] in WAITING_STATES
            for attempt in new[:-1] if pending else new:
                progress.clear()
                click.echo(f"== attempt {attempt['number']} on {place_of(attempt)} "
                           f"({_handle_words(attempt)} {handle_in(attempt)}, {attempt['state']}) ==", err=True)
                try:
                    for chunk in client.managed_logs(job_id, attempt["number"], follow=follow and attempt is new[-1],
                                                     tail=tail if not printed else 0):
                        write_bytes(chunk)
                except CorralError as exc:  # one unreachable cluster must not hide the other attempts' logs
                    click.echo(f"corral: could not read attempt {attempt['number']}'s log: {exc}", err=True)
                printed.add(attempt["number"])
            if not follow:
                return 0, found
            if new and not pending:
                continue  # the job as it is now that those attempts' output has ended
            if ended:
                progress.clear()
                return _managed_end(found), found
            # Once an attempt's output has ended, its job shows that attempt's state until the next tick.
            if pending or not printed or found["state"] in BETWEEN_ATTEMPTS:
                shown = _show_waiting(progress, _waiting_line(found, pending), shown)
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        progress.clear()
        click.echo(f"\ncorral: {job_id} keeps running; Ctrl-C only stopped following it. `corral jobs logs "
                   f"{job_id}` follows it again, `corral jobs cancel {job_id}` stops it.", err=True)
        return 130, found


def _waiting_line(found: dict[str, Any], pending: bool) -> str:
    """A managed job that runs nothing now: its state, why, and with an attempt `pending` in Slurm,
    where it waits and when Slurm expects it to start."""
    where = f" on {place_of(found)}" if pending and found.get("cluster") else ""
    return (f"{found['job_id']} {found['state']}{where}" + (f" ({found['reason']})" if found.get("reason") else "")
            + _then(expected_start(found.get("expected_start"))))


def _then(clause: str) -> str:
    return f"; {clause}" if clause else ""


def _show_waiting(progress: Any, line: str, shown: str | None) -> str:
    """A waiting line: on a terminal, the status line (rich, loaded then); elsewhere a line of its own
    each time it changes."""
    if line != shown:
        if sys.stderr.isatty():
            progress.waiting(line)
        else:
            click.echo(f"corral: {line}", err=True)
    return line


def _managed_end(found: dict[str, Any]) -> int:
    attempts = found["attempt_list"]
    last = attempts[-1] if attempts else {}
    exit_code = last.get("exit_code")
    where = f" on {place_of(last)}" if last.get("cluster") else ""
    count = f", {len(attempts)} attempt{'s' if len(attempts) != 1 else ''}"
    reason = f": {found['reason']}" if found.get("reason") else ""
    status = exit_status(found["state"], exit_code)
    apart = stderr_apart(found["job_id"], last.get("stderr_path"), status)
    click.echo(f"corral: {found['job_id']} {found['state']}{where} ({exit_code_text(exit_code)}{count}){reason}"
               f"{apart}", err=True)
    return status


def exit_code_text(code: int | None) -> str:
    """"exit code 3", or "no exit code" for a job that never ran or was cancelled before it reported one."""
    return "no exit code" if code is None else f"exit code {code}"


def _handle_words(attempt: dict[str, Any]) -> str:
    """What an attempt's handle is called where it ran."""
    return "Slurm job" if on_slurm(attempt) else "job"


def place(job: Any) -> str:
    """Where the job runs, as the server writes it (slurm/<cluster>/<partition>, ssh/<pool>)."""
    return place_of({"cluster": job.cluster, "partition": job.partition, **job.raw})


def _quietly(get: Any) -> Any:
    from corral.errors import CorralError

    try:
        return get()
    except (CorralError, KeyboardInterrupt):
        return None


def _wait_for_start(client: Any, job_id: str, progress: Any) -> Any:
    shown = None
    while True:
        job = client.job(job_id)
        if job.state not in WAITING_STATES:
            progress.clear()
            return job
        line = f"{job_id} {job.state} on {place(job)}" + (
            f" ({job.reason})" if job.reason else "") + _then(expected_start(job.raw.get("expected_start")))
        shown = _show_waiting(progress, line, shown)
        time.sleep(POLL_SECONDS)


class LazyProgress:
    """`render.LaunchProgress`, imported at the first event: rich then loads while the server probes
    the clusters, not before the request is sent."""

    def __init__(self) -> None:
        self._shown: Any = None

    def _real(self) -> Any:
        if self._shown is None:
            from corral.cli.render import LaunchProgress

            self._shown = LaunchProgress()
        return self._shown

    def __call__(self, event: dict[str, Any]) -> None:
        self._real()(event)

    def waiting(self, text: str) -> None:
        self._real().waiting(text)

    def clear(self) -> None:
        if self._shown is not None:
            self._shown.clear()
