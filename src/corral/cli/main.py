"""`corral` commands. Heavy imports (asyncio, rich, the engine) stay inside the commands so that
`corral --help` starts in well under 0.3 s."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from corral import __version__


def _reports_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Print a CorralError as one line on stderr and exit with its code, instead of a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from corral.errors import CorralError

        try:
            return func(*args, **kwargs)
        except CorralError as exc:
            click.echo(f"corral: error: {one_line(str(exc))}", err=True)
            sys.exit(exc.exit_code)

    return wrapper


def one_line(text: str) -> str:
    """An error message as one line: a line break or other control character from a user's value
    (a file name, a key) is shown escaped, never written out."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _print_json(value: object) -> None:
    click.echo(json.dumps(value, indent=2))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="corral")
def cli() -> None:
    """Corral: many independent Slurm clusters, one GPU pool.

    Clusters are the Host entries of ~/.slurm/config (OpenSSH syntax; CORRAL_SLURM_CONFIG overrides).
    """


@cli.command()
@click.argument("clusters", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per cluster.")
@click.option("--timeout", type=click.FloatRange(1, 3600), default=None,
              help="Most seconds to wait for each cluster's answer [default: CORRAL_TIMEOUT or 10].")
@_reports_errors
def check(clusters: tuple[str, ...], as_json: bool, timeout: float | None) -> None:
    """Check that each cluster's login node and Slurm controller answer.

    Exits non-zero if any cluster fails, with the reason per cluster.
    """
    from corral.sdk import Client

    checks = Client().check(list(clusters), timeout=timeout)
    if as_json:
        _print_json([c.raw for c in checks])
    else:
        from corral.cli.render import render_check

        render_check(checks)
    if not all(c.ok for c in checks):
        sys.exit(1)


@cli.command()
@click.argument("gpu", required=False)
@click.option("--infra", help="Only this infra: slurm/<cluster>[/<partition>].")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of rows (and of unreachable clusters).")
@click.option("--timeout", type=click.FloatRange(1, 3600), default=None,
              help="Most seconds to wait for each cluster's answer [default: CORRAL_TIMEOUT or 10].")
@_reports_errors
def gpus(gpu: str | None, infra: str | None, as_json: bool, timeout: float | None) -> None:
    """GPUs across every cluster: type, free/total, nodes and pending demand.

    GPU filters by name tolerantly: H100 matches the GRES type nvidia_h100_80gb_hbm3; L4 does not
    match L40.
    """
    from corral.sdk import Client

    report = Client().gpus(gpu, infra, timeout=timeout)
    if as_json:
        _print_json([r.raw for r in report.rows] + [f.raw for f in report.failures])
    else:
        from corral.cli.render import render_gpus

        render_gpus(report, gpu)
    if report.failures and not report.rows:
        sys.exit(1)


def _load_task(paths: tuple[str, ...], command: tuple[str, ...]) -> list[tuple[Any, str]]:
    from pathlib import Path

    from corral.task import TaskError, load_task, parse_task

    if command and paths:
        raise TaskError("give either task files or `-- COMMAND`, not both")
    if command:  # joined like a shell line, as `sky launch -- CMD` does: it becomes run.sh, not argv
        return [(parse_task({"run": " ".join(command)}, "command line"), "command line")]
    if not paths:
        raise TaskError("nothing to launch: give a task YAML or `-- COMMAND…`")
    return [(load_task(Path(p)), p) for p in paths]


@cli.command(context_settings={"allow_interspersed_args": True})
@click.argument("args", nargs=-1)
@click.option("-n", "--name", help="Job name (default: the task's name).")
@click.option("--gpus", help="Accelerators per node, e.g. H100:8 (overrides resources.accelerators).")
@click.option("--infra", help="slurm, slurm/<cluster> or slurm/<cluster>/<partition>.")
@click.option("--num-nodes", type=int, help="Number of nodes.")
@click.option("--cpus", help="CPUs per node: N or N+.")
@click.option("--memory", help="Memory per node in GB: N or N+.")
@click.option("--env", "envs", multiple=True, help="KEY=VALUE, repeatable.")
@click.option("--secret", "secret_values", multiple=True,
              help="KEY=VALUE, or KEY to take it from your environment: an env kept out of the store in clear text.")
@click.option("--num-jobs", type=int, default=1, show_default=True,
              help="Launch N copies (a sweep, at most 10,000); CORRAL_JOB_RANK tells them apart.")
@click.option("-d", "--detach", is_flag=True, help="Return once Slurm has accepted the job.")
@click.option("--dryrun", is_flag=True, help="Show the placement plan; submit nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("-c", "--cluster-name", "dev_name", help="Hold a named dev allocation (or reuse it) and run the task in it.")
@click.option("--idle-minutes", type=float, default=None, help="With -c: release the allocation after M idle minutes.")
@click.option("--time", "walltime", help="Walltime (sbatch --time), e.g. 4:00:00.")
@_reports_errors
def launch(args: tuple[str, ...], name: str | None, gpus: str | None, infra: str | None, num_nodes: int | None,
           cpus: str | None, memory: str | None, envs: tuple[str, ...], secret_values: tuple[str, ...], num_jobs: int,
           detach: bool, dryrun: bool,
           as_json: bool, dev_name: str | None, idle_minutes: float | None, walltime: str | None) -> None:
    """Run a task on the cluster that can start it soonest.

    ARGS: task YAML file(s), or `-- COMMAND…` for a one-liner. Without -d, follows the job's output and
    exits with its exit code.
    """
    import asyncio

    from corral.cli import render
    from corral.client import Client
    from pathlib import Path

    from corral.launch import LaunchEvents, Launcher, check_num_jobs
    from corral.state import open_store
    from corral.task import TaskError, apply_overrides, with_local_paths

    separator = "--" in sys.argv
    paths, command = (args, ()) if not separator else _split_command(args)
    check_num_jobs(num_jobs)
    loaded = _load_task(paths, command) if (paths or command or not dev_name) else []
    if dev_name and not loaded:
        from corral.task import parse_task

        loaded = [(parse_task({}, "command line"), "command line")]
    tasks = [
        (with_local_paths(apply_overrides(task, source, name=name, gpus=gpus, infra=infra, num_nodes=num_nodes,
                                          cpus=cpus, memory=memory, envs=envs, secrets=secret_values), Path.cwd()),
         source)
        for task, source in loaded
    ]
    if walltime and not dev_name:
        tasks = [(t.model_copy(update={"slurm": t.slurm.model_copy(update={"time": walltime})}), s)
                 for t, s in tasks]
    client = Client()
    store = open_store()
    events = LaunchEvents() if as_json else render.launch_events()
    launcher = Launcher(client, store, events)
    if dev_name and not dryrun:
        if len(tasks) != 1 or num_jobs != 1:
            raise TaskError("a dev allocation runs one task at a time (no sweeps with -c)")
        sys.exit(_launch_dev(client, store, launcher, dev_name, *tasks[0], idle_minutes, walltime, detach,
                             as_json))
    if dryrun:
        plans = [asyncio.run(launcher.plan(task, predict="all")) for task, _ in tasks]
        if as_json:
            _print_json([render.plan_json(p) for p in plans] if len(plans) > 1 else render.plan_json(plans[0]))
        else:
            for plan in plans:
                render.render_plan(plan, full=True)
        return
    # Relative workdir and file_mounts paths are relative to where the command runs, as in SkyPilot.
    per_task = asyncio.run(launcher.launch_many([(task, source, None) for task, source in tasks], num_jobs=num_jobs))
    results = [share for shares in per_task for share in shares]
    sweep = len(results) > 1 or num_jobs > 1
    if as_json:
        _print_json(render.sweep_json(results) if sweep else render.submitted_json(results[0]))
    if detach or sweep:
        if not as_json:
            for r in results:
                for job_id in r.job_ids:
                    click.echo(job_id)
        return
    from corral.tracker import Tracker

    code = asyncio.run(_follow_to_end(Tracker(client, store), store, results[0].job_ids[0]))
    sys.exit(code)


def _launch_dev(client: Any, store: Any, launcher: Any, name: str, task: Any, source: str,
                idle_minutes: float | None, walltime: str | None, detach: bool, as_json: bool) -> int:
    import asyncio

    from corral.config import load_user_settings
    from corral.dev import DevAllocations

    dev = DevAllocations(client, store, launcher)
    if idle_minutes is None:
        idle_minutes = load_user_settings().get("idle_minutes")
    row, new = asyncio.run(dev.launch(name, task, source, idle_minutes, walltime))

    def show(status: Any) -> None:
        if not as_json:
            click.echo(f"corral: {name}: {status.state}" + (f" ({status.reason})" if status.reason else ""), err=True)

    if detach:
        if as_json:
            _print_json({"name": name, "cluster": row.cluster, "partition": row.partition,
                         "slurm_job_id": row.slurm_job_id, "new": new})
        return 0
    status = asyncio.run(dev.wait_ready(row, on_state=show))
    alias = asyncio.run(dev.write_ssh_alias(row, status))
    if new and not as_json:
        click.echo(f"corral: {name} is ready on slurm/{row.cluster}/{row.partition} (nodes: {', '.join(status.nodes)}); "
                   f"`corral exec {name} -- CMD`, `corral ssh {name}`, or `ssh {name}` with `Include {alias}` "
                   "in ~/.ssh/config", err=True)
    if as_json:
        _print_json({"name": name, "cluster": row.cluster, "partition": row.partition,
                     "slurm_job_id": row.slurm_job_id, "new": new, "nodes": status.nodes})
    if not task.run:
        return 0
    _job_id, code = asyncio.run(dev.exec(name, task, source, _write_bytes))
    return code


def _split_command(args: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """click drops `--`; recover where it was from sys.argv."""
    after = sys.argv[sys.argv.index("--") + 1:]
    before = args[: len(args) - len(after)] if after else args
    return before, tuple(after)


async def _follow_to_end(tracker: Any, store: Any, job_id: str) -> int:
    import asyncio

    view = store.resolve(job_id)
    await tracker.logs(view, True, _write_bytes)
    for _ in range(30):
        await tracker.refresh()
        view = store.resolve(job_id)
        if view.attempt.state in ("SUCCEEDED", "FAILED", "CANCELLED", "LOST"):
            break
        await asyncio.sleep(1)
    attempt = view.attempt
    click.echo(f"corral: {job_id} {attempt.state} on slurm/{attempt.cluster}/{attempt.partition}"
               f" (exit code {attempt.exit_code})", err=True)
    if attempt.state == "SUCCEEDED":
        return 0
    return attempt.exit_code or 1


def _write_bytes(chunk: bytes) -> None:
    sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()


DEFAULT_QUEUE_LIMIT = 20


def parse_since(text: str) -> float:
    """`--since`: a duration back from now (90s, 30m, 2h, 3d, 1w) or a local date/time (2026-11-30T08:00)."""
    import time
    from datetime import datetime

    from corral.errors import CorralError

    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    raw = text.strip()
    if raw[:-1].isdigit() and raw[-1:] in units:
        return time.time() - int(raw[:-1]) * units[raw[-1]]
    try:
        return datetime.fromisoformat(raw).timestamp()
    except ValueError:
        raise CorralError(f"--since {text!r}: give a duration (30m, 2h, 3d, 1w) or a date (2026-11-30 or "
                          "2026-11-30T08:00)") from None


def _paging(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--limit` and `--page` for a listing of `what` (live ones always shown, ended ones paged)."""
    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        func = click.option("--page", type=click.IntRange(1, 1_000_000), default=1, show_default=True,
                            help=f"Which page of ended {what}, --limit per page.")(func)
        return click.option("-n", "--limit", type=click.IntRange(1, 100_000), default=DEFAULT_QUEUE_LIMIT,
                            show_default=True, help=f"How many ended {what} to show after the live ones.")(func)
    return decorate


@cli.command()
@click.argument("allocation", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of jobs (one object per job).")
@click.option("-a", "--all", "show_all", is_flag=True, help="Every job ever launched, newest first, streamed.")
@_paging("jobs (or sweeps)")
@click.option("--since", help="Only jobs launched since: 30m, 2h, 3d, 1w, or a date such as 2026-11-30.")
@click.option("-x", "--expand", is_flag=True, help="One row per job of a sweep (default: one row per sweep).")
@_reports_errors
def queue(allocation: str | None, as_json: bool, show_all: bool, limit: int, page: int, since: str | None,
          expand: bool) -> None:
    """Live jobs across all clusters, refreshed with one Slurm query per cluster, and the newest ended
    ones; a line says how many more there are."""
    from corral.cli import render
    from corral.sdk import Client

    client = Client()
    after = parse_since(since) if since else None
    if show_all:
        jobs = client.queue_all(since=after, allocation=allocation)
        if as_json:
            render.stream_json(j.raw for j in jobs)
        else:
            render.render_queue_stream(jobs)
        return
    shown = client.queue(limit=limit, page=page, since=after, allocation=allocation,
                         by_sweep=not as_json and not expand)
    if as_json:
        _print_json([j.raw for j in shown.jobs])
    else:
        render.render_queue(shown, expand)
        if shown.more:
            grouped = "" if expand else " (a sweep counts once)"
            click.echo(f"{shown.more} more ended job{'s' if shown.more != 1 else ''}{grouped}: "
                       f"`corral queue --page {page + 1}`, `--since 1d`, or `--all`", err=True)
    for warning in shown.warnings:
        click.echo(f"corral: warning: {warning}", err=True)


@cli.command()
@click.argument("job")
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the job ends.")
@_reports_errors
def logs(job: str, follow: bool) -> None:
    """Print a job's output (all nodes)."""
    from corral.sdk import Client

    for chunk in Client().logs(job, follow):
        _write_bytes(chunk)


@cli.command()
@click.argument("jobs", nargs=-1)
@click.option("--all", "cancel_all", is_flag=True, help="Cancel every live job.")
@_reports_errors
def cancel(jobs: tuple[str, ...], cancel_all: bool) -> None:
    """Cancel jobs (one scancel per cluster)."""
    from corral.errors import CorralError
    from corral.sdk import Client

    if not jobs and not cancel_all:
        raise CorralError("name the jobs to cancel, or use --all")
    for outcome in Client().cancel(list(jobs), all=cancel_all):
        word = "cancelled" if outcome.cancelled else f"already {outcome.state.lower()}"
        click.echo(f"{outcome.job_id}: {word}")


def _dev(store: Any = None) -> Any:
    from corral.client import Client
    from corral.dev import DevAllocations
    from corral.launch import Launcher
    from corral.state import open_store

    client = Client()
    store = store or open_store()
    return DevAllocations(client, store, Launcher(client, store))


@cli.command(name="exec", context_settings={"allow_interspersed_args": True})
@click.argument("name")
@click.argument("args", nargs=-1)
@click.option("--env", "envs", multiple=True, help="KEY=VALUE, repeatable.")
@click.option("--secret", "secret_values", multiple=True, help="KEY=VALUE or KEY: a secret env, repeatable.")
@_reports_errors
def exec_(name: str, args: tuple[str, ...], envs: tuple[str, ...], secret_values: tuple[str, ...]) -> None:
    """Run a task or `-- COMMAND` on every node of dev allocation NAME; exits with its exit code."""
    import asyncio

    from corral.task import apply_overrides

    dev = _dev()
    dev.get(name)  # unknown names fail before anything else
    separator = "--" in sys.argv
    paths, command = (args, ()) if not separator else _split_command(args)
    [(task, source)] = _load_task(paths, command)
    task = apply_overrides(task, source, envs=envs, secrets=secret_values)
    _job_id, code = asyncio.run(dev.exec(name, task, source, _write_bytes))
    sys.exit(code)


@cli.command(context_settings={"allow_interspersed_args": False})
@click.argument("name")
@click.argument("command", nargs=-1)
@_reports_errors
def ssh(name: str, command: tuple[str, ...]) -> None:
    """A shell on the head node of dev allocation NAME (through its login node), or run COMMAND there."""
    import asyncio
    import os

    if command and command[0] == "--":
        command = command[1:]
    argv = asyncio.run(_dev().ssh_argv(name, " ".join(command) if command else None))
    os.execvp(argv[0], argv)


@cli.command()
@click.argument("names", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of allocations.")
@_reports_errors
def status(names: tuple[str, ...], as_json: bool) -> None:
    """Dev allocations across all clusters: state, age, idle time, walltime left."""
    import asyncio

    dev = _dev()
    rows = [dev.get(n) for n in names] if names else None
    statuses = asyncio.run(dev.status(rows))
    if as_json:
        import time

        now = time.time()
        _print_json([s.to_json(now) for s in statuses])
    else:
        from corral.cli.render import render_status

        render_status(statuses)


@cli.command()
@click.argument("names", nargs=-1, required=True)
@_reports_errors
def down(names: tuple[str, ...]) -> None:
    """Release dev allocations (scancel), clean their files and ssh aliases."""
    import asyncio

    dev = _dev()
    for name in names:
        if asyncio.run(dev.down(name)):
            click.echo(f"{name}: released")
        else:
            click.echo(f"{name}: no such allocation (already down)", err=True)


@cli.group()
def server() -> None:
    """The background controller that drives managed jobs (one per state store)."""


@server.command(name="start")
@_reports_errors
def server_start() -> None:
    """Start the controller unless it runs."""
    from corral.controller import server as controller

    click.echo(f"controller running (pid {controller.start()}); log: {controller.log_file()}")


@server.command(name="stop")
@_reports_errors
def server_stop() -> None:
    """Stop the controller (managed jobs keep running in Slurm; a restart carries on)."""
    from corral.controller import server as controller

    click.echo("controller stopped" if controller.stop() else "controller was not running")


@server.command(name="status")
@click.option("--json", "as_json", is_flag=True, help="Print the controller's health as JSON.")
@_reports_errors
def server_status(as_json: bool) -> None:
    """Is the controller running, its last tick, and who holds the store's lease."""
    import time

    from corral.controller import server as controller

    try:  # answered by the controller: this process loads neither the engine nor the database
        health = controller.call("/health")
        lease = health["lease"]
    except controller.ControllerUnavailable as exc:
        from corral.controller.engine import LEASE
        from corral.state import open_store

        health = None
        pid = controller.running_pid()
        problem = f"pid {pid} runs, but {exc}" if pid else "not running"
        row = open_store().lease(LEASE)
        lease = {"holder": row.holder, "expires_at": row.expires_at} if row else None
    if as_json:
        _print_json({"running": health is not None, **(health or {"problem": problem}), "lease": lease})
    elif health is None:
        click.echo(f"controller {problem}")
    else:
        last = health["last_tick"]
        click.echo(f"controller running (pid {health['pid']}, up {health['uptime_seconds']:.0f}s, "
                   f"{health['ticks']} ticks, every {health['interval']:g}s)")
        if last:
            click.echo(f"last tick {time.time() - last['at']:.1f}s ago: {last['jobs']} live jobs, "
                       f"{last['seconds']:.3f}s, SSH calls {last['round_trips'] or {}}"
                       + (f", errors {last['errors']}" if last["errors"] else ""))
        if lease:
            click.echo(f"lease held by {lease['holder']} for {max(0, lease['expires_at'] - time.time()):.0f}s more")
    if health is None:
        sys.exit(1)


@cli.group()
def api() -> None:
    """Which Corral server this CLI uses: a remote one (team server), or the local one started on demand."""


@api.command(name="login")
@click.argument("url")
@click.option("--token", prompt=True, hide_input=True, help="The server's API token (asked for if not given).")
@_reports_errors
def api_login(url: str, token: str) -> None:
    """Use the server at URL from now on (saved, mode 600, in CORRAL_HOME/api.json)."""
    from corral.errors import CorralError
    from corral.sdk import Client
    from corral.sdk.endpoint import save_login

    if not url.startswith(("http://", "https://")):
        raise CorralError(f"{url!r}: give the server's URL, such as https://corral.example.org:8765")
    health = Client(url, token).health()  # refuses a wrong URL or token before anything is saved
    path = save_login(url, token)
    click.echo(f"logged in to {url} (Corral {health.get('version', '?')}, API {health.get('api', '?')}); "
               f"saved in {path}")


@api.command(name="logout")
@_reports_errors
def api_logout() -> None:
    """Forget the saved server: commands use the local one again."""
    from corral.sdk.endpoint import forget_login

    click.echo("logged out: commands use the local server" if forget_login() else "not logged in to a server")


@api.command(name="info")
@click.option("--json", "as_json", is_flag=True, help="Print the server's URL and health as JSON.")
@_reports_errors
def api_info(as_json: bool) -> None:
    """The server this CLI uses, and its health (starts the local one if needed)."""
    from corral.sdk import Client

    client = Client()
    health = client.health()
    point = client.endpoint
    if as_json:
        _print_json({"url": point.url, "local": point.local, **health})
    else:
        where = "local server" if point.local else "server"
        click.echo(f"{where} {point.url}: Corral {health.get('version', '?')}, API {health.get('api', '?')}, "
                   f"pid {health['pid']}, up {health['uptime_seconds']:.0f}s")


@cli.group()
def jobs() -> None:
    """Managed jobs: recovered from node failures and outages, re-routed while pending."""


@jobs.command(name="launch", context_settings={"allow_interspersed_args": True})
@click.argument("args", nargs=-1)
@click.option("-n", "--name", help="Job name.")
@click.option("--gpus", help="Accelerators per node, e.g. H100:8.")
@click.option("--infra", help="slurm, slurm/<cluster> or slurm/<cluster>/<partition>.")
@click.option("--num-nodes", type=int, help="Number of nodes.")
@click.option("--cpus", help="CPUs per node: N or N+.")
@click.option("--memory", help="Memory per node in GB: N or N+.")
@click.option("--env", "envs", multiple=True, help="KEY=VALUE, repeatable.")
@click.option("--secret", "secret_values", multiple=True, help="KEY=VALUE or KEY: a secret env, repeatable.")
@click.option("--num-jobs", type=int, default=1, show_default=True, help="Launch N managed copies (a sweep, at most 10,000).")
@click.option("--json", "as_json", is_flag=True, help="Print {job_id, job_ids}.")
@click.option("-d", "--detach", "detach", is_flag=True,
              help="Accepted as SkyPilot users type it: a managed job always returns once recorded.")
@_reports_errors
def jobs_launch(args: tuple[str, ...], name: str | None, gpus: str | None, infra: str | None,
                num_nodes: int | None, cpus: str | None, memory: str | None, envs: tuple[str, ...],
                secret_values: tuple[str, ...], num_jobs: int, as_json: bool, detach: bool) -> None:
    """Record a managed job and return its id at once; the controller places and watches it."""
    from pathlib import Path

    from corral import managed
    from corral.controller import server as controller
    from corral.launch import Launcher, check_num_jobs
    from corral.state import open_store
    from corral.task import apply_overrides, with_local_paths

    check_num_jobs(num_jobs)
    separator = "--" in sys.argv
    paths, command = (args, ()) if not separator else _split_command(args)
    [(task, source)] = _load_task(paths, command)
    task = apply_overrides(task, source, name=name, gpus=gpus, infra=infra, num_nodes=num_nodes, cpus=cpus,
                           memory=memory, envs=envs, secrets=secret_values)
    # The controller syncs the files later, from wherever it runs: it gets them as absolute paths.
    task = with_local_paths(task, Path.cwd())
    Launcher.check_local_files(task)
    ids = managed.record(open_store(), task, source, num_jobs)
    controller.start()
    if as_json:
        _print_json({"job_id": ids[0], "job_ids": ids})
    else:
        click.echo("\n".join(ids))


@jobs.command(name="queue")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.option("-a", "--all", "show_all", is_flag=True, help="Every managed job ever launched.")
@_paging("managed jobs")
@_reports_errors
def jobs_queue(as_json: bool, show_all: bool, limit: int, page: int) -> None:
    """Managed jobs with their state, attempts and reason (as of the controller's last tick): the live
    ones and the newest ended ones, newest first."""
    from corral.cli.managed_table import render_managed
    from corral.sdk import Client

    answer = Client().managed_jobs(limit=limit, page=page, all=show_all)
    rows, more = answer["jobs"], answer["more"]
    if as_json:
        _print_json(rows)
    else:
        render_managed(rows)
        if more:
            click.echo(f"{more} more ended managed job{'s' if more != 1 else ''}: "
                       f"`corral jobs queue --page {page + 1}` or `--all`", err=True)


@jobs.command(name="logs")
@click.argument("job")
@click.option("-f", "--follow", is_flag=True, help="Follow the current attempt until it ends.")
@_reports_errors
def jobs_logs(job: str, follow: bool) -> None:
    """A managed job's output across its attempts."""
    import asyncio

    from corral import managed
    from corral.client import Client
    from corral.state import open_store

    view = managed.resolve(open_store(), job)
    client = Client()
    submitted = [a for a in view.attempts if a.slurm_job_id]
    for attempt in submitted:
        last = attempt is submitted[-1]
        click.echo(f"== attempt {attempt.number} on slurm/{attempt.cluster}/{attempt.partition} "
                   f"(Slurm job {attempt.slurm_job_id}, {attempt.state}) ==", err=True)
        infra = client.infra(attempt.cluster)
        try:
            asyncio.run(infra.logs(attempt.slurm_job_id or "", attempt.log_path, follow and last, _write_bytes))
        except Exception as exc:  # one unreachable cluster must not hide the other attempts' logs
            click.echo(f"corral: could not read attempt {attempt.number}'s log: {exc}", err=True)


@jobs.command(name="cancel")
@click.argument("job_refs", nargs=-1)
@click.option("--all", "cancel_all", is_flag=True, help="Cancel every live managed job.")
@_reports_errors
def jobs_cancel(job_refs: tuple[str, ...], cancel_all: bool) -> None:
    """Ask the controller to cancel managed jobs (it scancels their attempts on its next tick)."""
    from corral import managed
    from corral.controller import server as controller
    from corral.errors import CorralError
    from corral.state import open_store
    from corral.state.store import MANAGED_TERMINAL

    if not job_refs and not cancel_all:
        raise CorralError("name the jobs to cancel, or use --all")
    store = open_store()
    views = managed.views(store) if cancel_all else [managed.resolve(store, j) for j in job_refs]
    live = [v for v in views if v.managed.state not in MANAGED_TERMINAL]
    managed.request_cancel(store, [v.job.id for v in live])
    controller.start()
    for v in views:
        click.echo(f"{v.job.id}: " + ("cancelling" if v in live else f"already {v.managed.state.lower()}"))


@jobs.command(name="events")
@click.argument("job")
@click.option("--json", "as_json", is_flag=True)
@_reports_errors
def jobs_events(job: str, as_json: bool) -> None:
    """A managed job's history: every state change and why."""
    import time

    from corral import managed
    from corral.state import open_store

    store = open_store()
    view = managed.resolve(store, job)
    events = store.events(view.job.id)
    if as_json:
        _print_json([{"at": e.at, "state": e.state, "reason": e.reason} for e in events])
        return
    for e in events:
        click.echo(f"{time.strftime('%H:%M:%S', time.localtime(e.at))}  {e.state:<11} {e.reason or ''}")


@jobs.command(name="why")
@click.argument("job")
@_reports_errors
def jobs_why(job: str) -> None:
    """Why a pending managed job waits where it is: its Slurm reason, predicted starts here and on the
    best alternative, and why it has not moved."""
    import asyncio

    from corral import managed
    from corral.cli.render import explain_pending
    from corral.client import Client
    from corral.controller.engine import ControllerSettings, _task
    from corral.launch import Launcher
    from corral.state import open_store

    store = open_store()
    view = managed.resolve(store, job)
    latest = view.latest
    if latest is None or latest.state not in ("PENDING", "SUBMITTING"):
        click.echo(f"{view.job.id} is {view.managed.state}: {view.managed.reason or ''}")
        return
    client = Client()
    plan = asyncio.run(Launcher(client, None).plan(_task(view.job), predict="all"))
    explain_pending(view, plan, ControllerSettings.from_env())


@cli.command()
def schema() -> None:
    """Print the task YAML's JSON Schema."""
    from corral.task import task_json_schema

    _print_json(task_json_schema())


EXIT_INTERNAL = 70  # EX_SOFTWARE: a bug in Corral, never the user's input


def main() -> None:
    import os

    os.umask(0o077)  # Corral's files (store, keys, logs, sockets) are the user's alone on a shared machine
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


def _report_usage_error(exc: click.ClickException) -> None:
    """A bad flag or argument: one line that says what and where to look, as CorralErrors do."""
    message = one_line(" ".join(exc.format_message().split()))
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
