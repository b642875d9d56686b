"""The `corral` command group, and the commands that read: check, gpus, queue, logs, cancel, schema.
The other groups have their own modules (launch, dev, jobs, server). Heavy imports (rich, the SDK) stay
inside the commands, so that `corral --help` loads click alone."""

from __future__ import annotations

import re
import sys
from typing import Any

import click

from corral import __version__
from corral.cli.common import (
    NumberRange,
    cancel_command,
    habit_flag,
    log_options,
    newest_id,
    paging,
    print_json,
    reports_errors,
    stream_json,
)
from corral.errors import printable

# SkyPilot's names for what Corral calls otherwise, and its commands that have no meaning on Slurm, with
# what to type instead: its users type them from habit.
SKYPILOT_ALIASES = {"show-gpus": "gpus"}
SKYPILOT_ONLY = {
    "stop": "a Slurm allocation cannot be stopped and started again: `corral down NAME` releases it, and "
            "`corral launch -c NAME` holds a new one",
    "start": "a Slurm allocation cannot be stopped and started again: `corral launch -c NAME` holds a new one "
             "(or reuses the live one of that name)",
}

JOB_ID = re.compile(r"c-[0-9a-f]{12}")  # a job's id, as `queue` shows it (a sweep's row: its first job's)


class CorralGroup(click.Group):
    """The top-level group: SkyPilot's spellings of Corral's commands work, and its commands that mean
    nothing on Slurm say what to do instead of "No such command"."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, SKYPILOT_ALIASES.get(cmd_name, cmd_name))

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None,
                                                                                list[str]]:
        if args and args[0] in SKYPILOT_ONLY and super().get_command(ctx, args[0]) is None:
            raise click.UsageError(f"Corral has no `{args[0]}` (SkyPilot's): {SKYPILOT_ONLY[args[0]]}", ctx)
        return super().resolve_command(ctx, args)


@click.group(cls=CorralGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="corral")
def cli() -> None:
    """Corral: many independent Slurm clusters, one GPU pool.

    Clusters are the Host entries of ~/.slurm/config (OpenSSH syntax; CORRAL_SLURM_CONFIG overrides).
    """


def infra_clusters(names: tuple[str, ...]) -> list[str]:
    """`corral check` arguments as clusters: `slurm` is all of them (as `sky check slurm`), `slurm/NAME`
    and NAME are one."""
    if "slurm" in names:
        return []
    return [name.removeprefix("slurm/") for name in names]


@cli.command()
@click.argument("clusters", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per cluster.")
@click.option("--timeout", type=NumberRange(1, 3600), default=None,
              help="Most seconds to wait for each cluster's answer [default: CORRAL_TIMEOUT or 10].")
@reports_errors
def check(clusters: tuple[str, ...], as_json: bool, timeout: float | None) -> None:
    """Check that each cluster's login node and Slurm controller answer.

    Exits non-zero if any cluster fails, with the reason per cluster.
    """
    from corral.sdk import Client

    checks = Client().check(infra_clusters(clusters), timeout=timeout)
    if as_json:
        print_json([c.raw for c in checks])
    else:
        from corral.cli.render import render_check

        render_check(checks)
    if not all(c.ok for c in checks):
        sys.exit(1)


@cli.command()
@click.argument("gpu", required=False)
@click.option("--infra", help="Only this infra: slurm[/<cluster>[/<partition>]], ssh[/<pool>] or k8s[/<context>].")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of rows (and of unreachable clusters).")
@habit_flag("-a", "--all")  # every GPU type is always shown (`sky show-gpus -a`)
@click.option("--timeout", type=NumberRange(1, 3600), default=None,
              help="Most seconds to wait for each cluster's answer [default: CORRAL_TIMEOUT or 10].")
@click.option("--max-age", type=NumberRange(0, 3600), default=0, metavar="SECONDS",
              help="Answer from the server's latest probe of each cluster if it started at most this long ago "
                   "(shared with every caller: for watch loops and many clusters) [default: 0, probe now].")
@reports_errors
def gpus(gpu: str | None, infra: str | None, as_json: bool, timeout: float | None, max_age: float) -> None:
    """GPUs across every cluster: type, free/total, nodes and pending demand.

    GPU filters by name tolerantly: H100 matches the GRES type nvidia_h100_80gb_hbm3; L4 does not
    match L40. H100:8 keeps the partitions where one node has 8 of them.
    """
    from corral.sdk import Client

    report = Client().gpus(gpu, infra, timeout=timeout, max_age=max_age)
    if as_json:
        print_json([r.raw for r in report.rows] + [f.raw for f in report.failures])
    else:
        from corral.cli.render import render_gpus

        render_gpus(report, gpu, shared=max_age > 0)
    if report.failures and not report.rows:
        sys.exit(1)


@cli.command()
@click.argument("allocation", required=False, metavar="[ALLOCATION | SWEEP]")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of jobs (one object per job).")
@click.option("-a", "--all", "show_all", is_flag=True, help="Every job ever launched, newest first, streamed.")
@paging("jobs (or sweeps)")
@click.option("-x", "--expand", is_flag=True, help="One row per job of a sweep (default: one row per sweep).")
@click.option("-t", "--state", "states", metavar="STATES",
              help="Only jobs in these states, comma-separated: PENDING, RUNNING, FAILED…, live, or Slurm's PD, R, "
                   "CD… (as squeue -t); newest first, --limit a page.")
@click.option("--infra", help="Only jobs on this cluster: slurm/<cluster> (ssh/<pool>, k8s/<context>, or the name "
                               "alone).")
@click.option("--name", "name_part", metavar="TEXT", help="Only jobs whose name contains TEXT.")
@click.option("-u", "--user", metavar="USER", help="Only USER's jobs (a team server's admin sees everyone's).")
@reports_errors
def queue(allocation: str | None, as_json: bool, show_all: bool, limit: int, page: int, since: float | None,
          expand: bool, states: str | None, infra: str | None, name_part: str | None, user: str | None) -> None:
    """Live jobs across all clusters, refreshed with one Slurm query per cluster, and the newest ended
    ones; a line says how many more there are. With --state, --infra, --name or --user: the jobs that
    match, live or ended, newest first, one row per job. ALLOCATION: the jobs run in that dev
    allocation; SWEEP (the id a sweep's row shows): that sweep's jobs, one row each."""
    from corral.sdk import Client

    client = Client()
    if allocation and JOB_ID.fullmatch(allocation) and not show_all:
        if _filtered_queue(client, None, as_json, limit, page, since, states, infra, name_part, user,
                           sweep=allocation):
            return
        from corral.errors import CorralError, NotFoundError

        try:
            _queue(client, allocation, as_json, show_all, limit, page, since, expand, states, infra, name_part, user)
        except CorralError as exc:
            if exc.exit_code != NotFoundError.exit_code:
                raise
            raise NotFoundError(f"no job or sweep {allocation!r}, and no dev allocation of that name: `corral "
                                "queue` lists your jobs, `corral status` your allocations") from None
        return
    _queue(client, allocation, as_json, show_all, limit, page, since, expand, states, infra, name_part, user)


def _queue(client: Any, allocation: str | None, as_json: bool, show_all: bool, limit: int, page: int,
           since: float | None, expand: bool, states: str | None, infra: str | None, name_part: str | None,
           user: str | None) -> None:
    if states is not None or infra or name_part or user:
        if show_all:
            raise click.UsageError("--all streams every job: give it without --state, --infra, --name or --user")
        _filtered_queue(client, allocation, as_json, limit, page, since, states, infra, name_part, user)
        return
    if show_all:
        jobs = client.queue_all(since=since, allocation=allocation)
        if as_json:
            stream_json(j.raw for j in jobs)
        else:
            from corral.cli import render

            render.render_queue_stream(jobs)
        return
    shown = client.queue(limit=limit, page=page, since=since, allocation=allocation,
                         by_sweep=not as_json and not expand)
    if as_json:
        print_json([j.raw for j in shown.jobs])
    else:
        from corral.cli import render

        render.render_queue(shown, expand, live_only=limit == 0)
        if shown.more and limit:
            grouped = "" if expand else " (a sweep counts once)"
            click.echo(f"{shown.more} more ended job{'s' if shown.more != 1 else ''}{grouped}: "
                       f"`corral queue --page {page + 1}`, `--since 1d`, or `--all`", err=True)
    for warning in shown.warnings:
        click.echo(f"corral: warning: {warning}", err=True)


def _filtered_queue(client: Any, allocation: str | None, as_json: bool, limit: int, page: int, since: float | None,
                    states: str | None, infra: str | None, name_part: str | None, user: str | None,
                    sweep: str = "") -> bool:
    """`queue` narrowed by its filters: a page of the jobs that match (GET /jobs), newest first. With
    `sweep`, nothing is printed when no job has that id (the name may be an allocation's): False."""
    from corral.sdk.types import QueuePage

    cluster = (infra or "").removesuffix("/")
    for kind in ("slurm/", "ssh/", "k8s/"):
        cluster = cluster.removeprefix(kind)
    if "/" in cluster:
        raise click.UsageError(f"--infra {infra}: give a cluster (slurm/<cluster>), a pool (ssh/<pool>) or a context "
                               "(k8s/<context>), not a partition")
    if limit == 0:  # -s: the live ones among those
        if states is not None:
            raise click.UsageError("-s is --state live: give one of them")
        states = "live"
    per_page = min(limit or 1000, 1000)
    shown, total = client.jobs(owner=user or "", state=states or "", cluster=cluster, name=name_part or "",
                               since=since, allocation=allocation or "", sweep=sweep, limit=per_page, page=page)
    if sweep and not total and not client.jobs(sweep=sweep, limit=1)[1]:
        return False
    if as_json:
        print_json([j.raw for j in shown])
        return True
    more = max(0, total - (page - 1) * per_page - len(shown))
    if not shown:
        click.echo("No jobs match." if not more else "No matching jobs on this page.")
        return True
    from corral.cli import render

    render.render_queue(QueuePage(shown, more, {}, []), expand=True)
    if more:
        click.echo(f"{more} more matching job{'s' if more != 1 else ''}: `--page {page + 1}`", err=True)
    return True


@cli.command()
@log_options("Keep printing until the job ends, as `sky logs` does; --no-follow prints what there is.",
             "Start with the last N lines of what there is (0: all of it), as `sky logs --tail`.", in_allocation=True)
@click.option("--stderr", is_flag=True, help="The file an sbatch script's --error sends stderr to, apart from "
                                             "its output (with --sync-down, saved beside it anyway).")
@reports_errors
def logs(job: str | None, follow: bool, tail: int, status: bool, sync_down: bool, stderr: bool,
         allocation: str | None = None) -> None:
    """Print a job's output (all nodes), following it until it ends; then how it ended, and exit with
    its exit code, as an attached `launch` does. Without JOB: your newest job. A dev allocation's name
    alone means its newest job; `ALLOCATION JOB` one of its jobs (as `sky logs CLUSTER JOB_ID`)."""
    from corral.sdk import Client

    client = Client()
    if job is None:
        job = newest_id(client.jobs(limit=1)[0], "no jobs yet: name one, or launch one with `corral launch`")
    if allocation is not None:  # `sky logs CLUSTER JOB_ID`: its number there, or its id or name
        job = client.job(job, allocation=allocation).job_id
    from corral.cli.following import LazyProgress, follow_to_end, print_snapshot, status_only

    if status:
        sys.exit(status_only(client.job(job)))
    if sync_down:
        from corral.cli.sync_down import sync_down_job

        sync_down_job(client, job)
        return
    if follow:  # while it is pending, its Slurm reason and expected start on a status line, as `launch`
        sys.exit(follow_to_end(client, job, LazyProgress(), tail=tail, stderr=stderr))
    if (cut := print_snapshot(client, job, tail=tail, stderr=stderr)) is not None:  # what there is, not all
        sys.exit(cut.exit_code)


@cli.command()
@cancel_command("jobs")
@reports_errors
def cancel(refs: list[str], cancel_all: bool, all_users: bool) -> list[Any]:
    """Cancel jobs (one scancel per cluster)."""
    from corral.sdk import Client

    return Client().cancel(refs, all=cancel_all, all_users=all_users)


def _register() -> None:
    """The other command groups, each in its own module (importing them costs click only)."""
    from corral.cli import dashboard, dev, jobs, launch, sbatch, server, users

    cli.add_command(launch.launch)
    cli.add_command(sbatch.sbatch)
    for command in (dev.exec_, dev.ssh, dev.status, dev.down, dev.autostop):
        cli.add_command(command)
    cli.add_command(jobs.jobs)
    cli.add_command(server.server)
    cli.add_command(server.api)
    cli.add_command(users.users)
    cli.add_command(dashboard.dashboard)


_register()


@cli.command()
def schema() -> None:
    """Print the task YAML's JSON Schema."""
    from corral.task import task_json_schema

    print_json(task_json_schema())


EXIT_INTERNAL = 70  # EX_SOFTWARE: a bug in Corral, never the user's input


def main() -> None:
    import os

    os.umask(0o077)  # Corral's files (store, keys, logs, sockets) are the user's alone on a shared machine
    _tolerant_output()
    try:
        code = cli(prog_name="corral", standalone_mode=False)  # returns an exit code for --help and ctx.exit
        if isinstance(code, int) and code:
            sys.exit(code)
    except click.exceptions.Abort:
        click.echo("corral: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        _report_usage_error(exc)
        sys.exit(exc.exit_code)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        click.echo("corral: interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, never a traceback
        _report_internal_error(exc)
        sys.exit(EXIT_INTERNAL)


def _tolerant_output() -> None:
    """Output whose encoding is not UTF-8 (a latin-1 locale, PYTHONIOENCODING=ascii, a legacy pipe) gets
    `?` for a character it cannot show (the plan's →, a job's name), never a crash halfway through."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None and getattr(sys.stdout, "errors", None) == "strict":
        reconfigure(errors="replace")


def _report_usage_error(exc: click.ClickException) -> None:
    """A bad flag or argument: one line that says what and where to look, as CorralErrors do."""
    message = printable(" ".join(exc.format_message().split()))
    context = getattr(exc, "ctx", None)
    hint = f" (see `{context.command_path} --help`)" if context is not None else ""
    click.echo(f"corral: error: {message}{hint}", err=True)


def _report_internal_error(exc: BaseException) -> None:
    """A bug: one line for the user, the traceback in ~/.corral/crash.log for the report."""
    import os
    import traceback

    where = "the traceback could not be saved"
    try:
        from corral.config import corral_home, private_dir

        log = private_dir(corral_home()) / "crash.log"
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write("".join(traceback.format_exception(exc)) + "\n")
        where = f"details in {log}"
    except OSError:
        pass
    if os.environ.get("CORRAL_DEBUG"):
        traceback.print_exception(exc)
    click.echo(f"corral: internal error: {type(exc).__name__}: {' '.join(str(exc).split())[:300]} "
               f"(a bug in Corral; {where})", err=True)
