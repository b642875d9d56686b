"""What every command module shares: one-line errors with the error class's exit code, JSON output,
raw output bytes, `--` and paging options. Imports click only."""

from __future__ import annotations

import functools
import json
import math
import shlex
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import click

DEFAULT_QUEUE_LIMIT = 20


class NumberRange(click.FloatRange):
    """click's FloatRange that also refuses `nan` (which compares false with both bounds, so passes them)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if math.isnan(number):
            self.fail(f"{value!r} is not a number.", param, ctx)
        return number


def reports_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Print a CorralError on stderr (one line, or a line and its list: errors.printed) and exit with its
    code, instead of a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from corral.errors import CorralError, printed

        try:
            return func(*args, **kwargs)
        except CorralError as exc:
            click.echo(f"corral: error: {printed(str(exc))}", err=True)
            sys.exit(exc.exit_code)

    return wrapper


def show_plans(plans: list[list[dict[str, Any]]], as_json: bool) -> None:
    """A dry run's plans (`launch --dryrun`, `sbatch --test-only`), as JSON or tables; then, where no place
    can run a task, an UnavailableError (exit 69, said by reports_errors) as its launch would, and as
    `sbatch --test-only` fails a job no partition can take (before, it exited 0 with every row saying
    why not)."""
    if as_json:
        print_json(plans if len(plans) > 1 else plans[0])
    else:
        from corral.cli import render

        for plan in plans:
            render.render_plan(plan, full=True)
    if any(not any(row.get("feasible") for row in plan) for plan in plans):
        from corral.errors import UnavailableError

        raise UnavailableError("no cluster can run this task: each row of the plan says why")


def print_json(value: object) -> None:
    click.echo(json.dumps(value, indent=2))


def stream_json(rows: Iterable[dict[str, object]]) -> None:
    """A JSON list written as it comes, one object per line."""
    out = sys.stdout
    out.write("[")
    for i, row in enumerate(rows):
        out.write(("\n  " if i == 0 else ",\n  ") + json.dumps(row))
    out.write("\n]\n")
    out.flush()


def write_bytes(chunk: bytes) -> None:
    sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()


def split_command(args: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """click drops `--`; recover where it was from sys.argv: (task files, command words)."""
    if "--" not in sys.argv:
        return args, ()
    after = sys.argv[sys.argv.index("--") + 1:]
    before = args[: len(args) - len(after)] if after else args
    return before, tuple(after)


def warn(message: str) -> None:
    """One warning line on stderr (the task runs; something in it has no meaning here)."""
    click.echo(f"corral: warning: {message}", err=True)


def warnings_only(event: dict[str, Any]) -> None:
    """A launch's events as `--json` shows them on stderr: its warnings, nothing else."""
    if event.get("event") == "warning":
        warn(str(event.get("message")))


def task_arguments(args: tuple[str, ...], *, allow_empty: bool = False) -> tuple[list[str], str | None]:
    """(task file paths, one command line) from a command's arguments. As `sky launch` reads its
    ENTRYPOINT: arguments naming YAML files are task files; anything else is one command line, with or
    without `--`, joined like a shell line (it becomes the task's run, not argv)."""
    from corral.errors import TaskError

    paths, command = split_command(args)
    if len(paths) == 1 and not command and batch_script(paths[0]):
        return list(paths), None  # `corral launch job.sh`: an sbatch script, run as sbatch would
    if paths and not command and not all(p.endswith((".yaml", ".yml")) for p in paths):
        paths, command = (), paths  # `corral launch 'echo hi'`, as `sky launch 'echo hi'`
    if command and paths:
        raise TaskError("give either task files or `-- COMMAND`, not both")
    if not paths and not command and not allow_empty:
        raise TaskError("nothing to launch: give a task YAML or a command (`corral launch 'python train.py'`)")
    return list(paths), " ".join(command) if command else None


def batch_script(path: str) -> bool:
    """Does `path` name an sbatch job script (a `#!` line and `#SBATCH` directives)?"""
    from corral.sbatch_script import is_batch_script

    try:
        with open(path, "rb") as f:
            head = f.read(64 * 1024)
    except (OSError, ValueError):
        return False
    return is_batch_script(head.decode("utf-8", errors="replace"))


def read_env_file(path: str) -> list[str]:
    """KEY=VALUE items from a dotenv file (`--env-file`): `KEY=VALUE` or `export KEY=VALUE` lines, values
    optionally in matching quotes, `#` comments and blank lines skipped."""
    from corral.errors import TaskError

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskError(f"--env-file {path}: cannot read it ({exc.__class__.__name__}: {exc})") from None
    items = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key.isidentifier():
            raise TaskError(f"{path}:{number}: expected KEY=VALUE (or export KEY=VALUE), got {line[:80]!r}")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        items.append(f"{key}={value}")
    return items


def paging(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--limit` and `--page` for a listing of `what` (live ones always shown, ended ones paged),
    `--since` (the command sees a Unix time, or None), and `-s`/`--skip-finished` (SkyPilot's), which
    shows the live ones only: the command sees `limit` 0."""
    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def live_only_when_skipping(*args: Any, skip_finished: bool, since: str | None, **kwargs: Any) -> Any:
            if skip_finished:
                kwargs["limit"] = 0
            return command(*args, since=parse_since(since) if since else None, **kwargs)

        func = click.option("--since", help=f"Only {what} launched since: 30m, 2h, 3d, 1w, or a date such as "
                                            "2026-11-30.")(live_only_when_skipping)
        func = click.option("-s", "--skip-finished", is_flag=True,
                            help=f"Only the live {what}, as `sky queue -s`.")(func)
        func = click.option("--page", type=click.IntRange(1, 1_000_000), default=1, show_default=True,
                            help=f"Which page of ended {what}, --limit per page.")(func)
        return click.option("-n", "--limit", type=click.IntRange(1, 100_000), default=DEFAULT_QUEUE_LIMIT,
                            show_default=True, help=f"How many ended {what} to show after the live ones.")(func)
    return decorate


def parse_since(text: str) -> float:
    """`--since`: a duration back from now (90s, 30m, 2h, 3d, 1w) or a local date/time (2026-11-30T08:00)."""
    import time
    from datetime import datetime

    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    raw = text.strip()
    now = time.time()
    if raw[:-1].isdigit() and raw[-1:] in units:
        return max(0.0, now - int(raw[:-1]) * units[raw[-1]])  # before 1970: everything
    try:
        date = datetime.fromisoformat(raw)
    except ValueError:
        raise click.UsageError(f"--since {text!r}: give a duration (30m, 2h, 3d, 1w) or a date (2026-11-30 or "
                               "2026-11-30T08:00)") from None
    try:
        return min(max(0.0, date.timestamp()), now)  # in the future: nothing has ended since
    except (OverflowError, OSError, ValueError):  # a year the platform cannot place
        return 0.0 if date.year < 1970 else now


def log_options(follow_help: str, tail_help: str, *, in_allocation: bool = False
                ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """JOB (optional: the newest, see newest_id), --follow/--no-follow, --tail and --status, for `logs` and
    `jobs logs`. `in_allocation`: `ALLOCATION JOB` too, as `sky logs CLUSTER JOB_ID` (the command gets
    `allocation`)."""
    def decorate(show: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(show)
        def func(*args: Any, job: str | None = None, name: str | None = None, job_in: str | None = None,
                 **kwargs: Any) -> Any:
            if job is not None and name is not None:
                raise click.UsageError("give JOB or --name, not both")
            if job_in is not None:
                kwargs["allocation"], job = job, job_in
            return show(*args, job=job if job is not None else name, **kwargs)

        for decorator in reversed([
            click.argument("job", required=False, metavar="[JOB | ALLOCATION [JOB]]" if in_allocation else None),
            *([click.argument("job_in", required=False, metavar="")] if in_allocation else []),
            click.option("-n", "--name", metavar="NAME", help="The job of this name (as JOB does; SkyPilot's "
                                                              "--name)."),
            click.option("--follow/--no-follow", default=True, show_default=True, help=follow_help),
            click.option("-f", "follow", flag_value=True, hidden=True),  # the flag before following became the default
            click.option("--tail", type=click.IntRange(0, 10_000_000), default=0, metavar="N", help=tail_help),
            click.option("--status", is_flag=True,
                         help="Print no output, only the job's state; exit 0 if it succeeded, 75 while it has "
                              "not ended, else as when following it (as `sky logs --status`)."),
            click.option("-s", "--sync-down", is_flag=True,
                         help="Save its output as it is now to ~/corral_logs/<job id>/ and print the file's path, "
                              "as `sky logs --sync-down`."),
        ]):
            func = decorator(func)
        return func
    return decorate


def piped_stdin() -> Any:
    """Standard input when something is piped or redirected into it; None for a terminal, or when it is
    closed (`<&-`: sys.stdin is None)."""
    return sys.stdin if sys.stdin is not None and not sys.stdin.isatty() else None


def newest_id(jobs: list[Any], nothing: str) -> str:
    """The id of the first of `jobs` (a listing, newest first); none: a not-found error saying `nothing`."""
    from corral.errors import NotFoundError

    if not jobs:
        raise NotFoundError(nothing)
    return str(jobs[0].job_id)


yes_option = click.option("-y", "--yes", "yes", is_flag=True,
                          help="Accepted as SkyPilot users type it: Corral asks for no confirmation.")


def habit_flag(*flags: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A SkyPilot flag typed from habit that has nothing to change here, hidden: accepted rather than
    "No such option", and said nothing of (a note is the command's to print, after its refusals, so
    that an error stays one line)."""
    return click.option(*flags, is_flag=True, hidden=True, expose_value=False)


def cancel_command(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """JOB…, -n/--name (as SkyPilot's `sky jobs cancel -n`), -a/--all, -u/--all-users and -y for `cancel`
    and `jobs cancel`; the command gets the references (names included), --all and --all-users, and
    returns the outcomes, which are printed here. `what`: "jobs" or "managed jobs"."""
    def decorate(cancel: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(cancel)
        def command(job_refs: tuple[str, ...], names: tuple[str, ...], cancel_all: bool, all_users: bool,
                    yes: bool) -> None:
            refs = [*job_refs, *names]
            if not refs and not cancel_all:
                raise click.UsageError("name the jobs to cancel, or use --all")
            outcomes = cancel(refs, cancel_all, all_users)
            done = "cancelling" if what == "managed jobs" else "cancelled"
            for outcome in outcomes:
                click.echo(f"{outcome.job_id}: " + (done if outcome.cancelled else f"already {outcome.state.lower()}"))
            group = "corral jobs" if what == "managed jobs" else "corral"
            for outcome in outcomes:
                if outcome.sweep_jobs:
                    how = (f"`{group} cancel {shlex.quote(outcome.sweep_name)}` cancels them all" if outcome.sweep_name
                           else f"`{group} queue {outcome.job_id}` lists them")
                    click.echo(f"{outcome.job_id} is the first of the {outcome.sweep_jobs} jobs of a sweep"
                               + (f" ({outcome.sweep_name})" if outcome.sweep_name else "")
                               + f", and its id names that job alone: {how}", err=True)
            if not outcomes:
                click.echo(f"no live {what} to cancel", err=True)

        for decorator in reversed([
            click.argument("job_refs", nargs=-1),
            click.option("-n", "--name", "names", multiple=True, metavar="NAME",
                         help=f"The {what} of this name (as JOB does; SkyPilot's --name); repeatable."),
            click.option("-a", "--all", "cancel_all", is_flag=True, help=f"Cancel every live {what[:-1]} of yours."),
            click.option("-u", "--all-users", is_flag=True, help=f"With --all: every user's live {what} (admins)."),
            yes_option,
        ]):
            command = decorator(command)
        return command
    return decorate


# `sky launch` flags for cloud VMs, hidden: typed from habit, each gets a warning saying why it changes
# nothing here (the task file's fields get the same words, task_compat.py), not "No such option".
_IGNORED_FLAGS = {"use_spot": "--use-spot", "disk_size": "--disk-size", "disk_tier": "--disk-tier",
                  "ports": "--ports", "instance_type": "--instance-type", "network_tier": "--network-tier"}


DOWN_IDLE_MINUTES = 1.0  # `launch -c NAME --down` without -i: released once its jobs are done, after this


def _skypilot_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """Takes SkyPilot's launch flags off the command's arguments: --cloud/--region/--zone become --infra
    (as the task file's cloud/region/zone), the VM ones are ignored with a warning, --retry-until-up and
    --down say what Corral does instead."""
    @functools.wraps(command)
    def launch(*args: Any, cloud: str | None, region: str | None, zone: str | None, retry_until_up: bool,
               down: bool, fast: bool, **kwargs: Any) -> Any:
        from corral.skypilot_only import IGNORED_RESOURCE_FIELDS

        if cloud or region or zone:
            if kwargs.get("infra"):
                raise click.UsageError("use either --infra or --cloud/--region/--zone, not both")
            if not cloud or (zone and not region):
                raise click.UsageError("--region (a cluster) and --zone (a partition) need --cloud: "
                                       "--cloud slurm --region CLUSTER [--zone PARTITION], or --infra")
            kwargs["infra"] = "/".join(part for part in (cloud, region, zone) if part)
        down_alone = down and kwargs.get("dev_name") and kwargs.get("idle_minutes") is None
        if down_alone:  # SkyPilot's autodown once its jobs are done; with -i, -i is what Corral does anyway
            kwargs["idle_minutes"] = DOWN_IDLE_MINUTES
        if kwargs.get("no_setup") and not kwargs.get("dev_name"):
            raise click.UsageError("--no-setup goes with -c NAME (the dev allocation runs the task without its "
                                   "setup); a job runs its setup inside its own allocation")
        for field, flag in _IGNORED_FLAGS.items():  # after the refusals: an error stays one line
            if kwargs.pop(field) not in (None, False, ()):
                click.echo(f"corral: warning: {flag}: ignored on Slurm ({IGNORED_RESOURCE_FIELDS[field]})", err=True)
        if retry_until_up:
            click.echo("corral: note: --retry-until-up: nothing to retry; a job that cannot start now waits in "
                       "Slurm's queue (a managed job is moved where it can start sooner)", err=True)
        if down_alone:
            click.echo(f"corral: note: --down: {kwargs['dev_name']} is released once nothing has run in it for "
                       f"{DOWN_IDLE_MINUTES:g} minute", err=True)
        elif down and not kwargs.get("dev_name"):
            click.echo("corral: note: --down: a job's nodes are released when it ends, always", err=True)
        if fast:
            click.echo("corral: note: --fast: nothing to skip: Corral provisions no machines", err=True)
        return command(*args, **kwargs)

    for decorator in reversed([
        click.option("--cloud", hidden=True), click.option("--region", hidden=True),
        click.option("--zone", hidden=True),
        click.option("--use-spot/--no-use-spot", "use_spot", default=None, hidden=True),
        click.option("--disk-size", hidden=True), click.option("--disk-tier", hidden=True),
        click.option("--ports", multiple=True, hidden=True), click.option("--instance-type", hidden=True),
        click.option("--network-tier", hidden=True),
        click.option("--retry-until-up", "-r", "retry_until_up", is_flag=True, hidden=True),
        click.option("--down", is_flag=True, hidden=True),
        click.option("--fast", is_flag=True, hidden=True),
    ]):
        launch = decorator(launch)
    return launch


def task_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The overrides `launch` and `jobs launch` share, as SkyPilot names them (and its cloud flags,
    hidden: _skypilot_flags)."""
    func = _skypilot_flags(func)
    for decorator in reversed([
        click.option("-n", "--name", help="Job name (default: the task's name)."),
        click.option("--gpus", help="Accelerators per node, e.g. H100:8 (overrides resources.accelerators)."),
        click.option("--infra", help="Where: slurm[/<cluster>[/<partition>]], ssh[/<pool>] or k8s[/<context>]."),
        click.option("--num-nodes", type=click.IntRange(1, 100_000), help="Number of nodes."),
        click.option("--cpus", help="CPUs per node: N or N+."),
        click.option("--memory", help="Memory per node in GB: N or N+, or with a unit (512MB, 1TB+)."),
        click.option("--env", "envs", multiple=True,
                     help="KEY=VALUE, or KEY to take it from your environment; repeatable."),
        click.option("--env-file", "env_file", type=click.Path(dir_okay=False),
                     help="A dotenv file of KEY=VALUE lines; --env wins over it."),
        click.option("--workdir", help="A local directory synced as the task's workdir (overrides workdir)."),
        click.option("--image-id", "image_id", help="Container image, docker:<image> (overrides resources.image_id)."),
        yes_option,
        click.option("--secret", "secret_values", multiple=True,
                     help="KEY=VALUE, or KEY to take it from your environment: an env kept out of the store "
                          "in clear text."),
    ]):
        func = decorator(func)
    return func


def place_of(answer: Mapping[str, Any]) -> str:
    """Where a job, attempt or allocation of the server's answer is, as it writes it (slurm/<cluster>/
    <partition>, ssh/<pool>, k8s/<context>); Slurm's form from a server that gives no `infra`."""
    return str(answer.get("infra") or f"slurm/{answer['cluster']}/{answer['partition']}")


def on_slurm(answer: Mapping[str, Any]) -> bool:
    """Whether the server's answer (a job, attempt, allocation, GPU row) is on a Slurm cluster, not on a
    pool or a context; a server that gives no `infra` knows only Slurm."""
    return str(answer.get("infra") or "slurm/").startswith("slurm/")


def handle_in(answer: Mapping[str, Any]) -> Any:
    """A server's answer's handle (a job's, an attempt's, an allocation's): `handle`, or `slurm_job_id`
    from a server older than that name."""
    return answer["handle"] if "handle" in answer else answer.get("slurm_job_id")


def handle_header(answers: Iterable[Mapping[str, Any]]) -> str:
    """The title of a table's column of handles: SLURM ID while every row shown is on Slurm, as a Slurm
    user reads it, and INFRA ID once a pool's or a context's handle (lab1/d575218a0cac) is among them."""
    return "SLURM ID" if all(on_slurm(a) for a in answers if a.get("cluster")) else "INFRA ID"
