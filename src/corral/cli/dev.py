"""Dev allocations: `launch -c NAME`, `exec`, `ssh`, `status`, `down`, through the server's API (one
or two calls each; this process loads the SDK and rich only)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from corral.cli.common import (
    habit_flag,
    handle_in,
    place_of,
    print_json,
    reports_errors,
    task_arguments,
    warnings_only,
    write_bytes,
    yes_option,
)


def launch_dev(args: tuple[str, ...], dev_name: str, *, name: str | None, gpus: str | None, infra: str | None,
               num_nodes: int | None, cpus: str | None, memory: str | None, envs: tuple[str, ...],
               secret_values: tuple[str, ...], num_jobs: int, idle_minutes: float | None, walltime: str | None,
               detach: bool, as_json: bool, workdir: str | None = None, image_id: str | None = None,
               setup: bool = True) -> int:
    """`corral launch -c NAME`: hold (or reuse) a named allocation, then run the task in it (with -d:
    start it and return, as `sky launch -d`; a task without `run` returns once Slurm has the holder)."""
    from corral.cli.render import LaunchProgress, allocation_state
    from corral.config import load_user_settings
    from corral.errors import TaskError
    from corral.sdk import Client

    paths, command = task_arguments(args, allow_empty=True)
    if len(paths) > 1 or num_jobs != 1:
        raise TaskError("a dev allocation runs one task at a time (no sweeps with -c)")
    task = Path(paths[0]) if paths else None
    # --idle-minutes, else the task's autostop (the server reads it), else the user's default
    default_idle: Any = load_user_settings().get("idle_minutes")
    progress = LaunchProgress()
    announced: list[dict[str, Any]] = []

    def announce(held: dict[str, Any]) -> None:
        """Say the allocation is ready (and its JSON), once, before any output of the task."""
        progress.clear()
        announced.append(held)
        summary = {**{k: held.get(k) for k in ("name", "cluster", "partition")}, "handle": handle_in(held),
                   "slurm_job_id": handle_in(held), "new": held.get("new")}
        if detach:
            job_id = held.get("job_id")
            if as_json:
                print_json({**summary, "job_id": job_id, "queued": bool(held.get("queued"))} if job_id else summary)
            elif job_id:
                say_detached(job_id, dev_name, held.get("queued"))
                click.echo(job_id)
            return
        if held["new"] and not as_json:
            ways = (f"`corral ssh {dev_name}`, or `ssh {dev_name}` with `Include {held['ssh_alias']}` in ~/.ssh/config"
                    if held.get("ssh_alias") else "or your own ssh login to its node (through a team server)")
            click.echo(f"corral: {dev_name} is ready on {place_of(held)} (nodes: "
                       f"{', '.join(held['nodes'])}); `corral exec {dev_name} -- CMD`, {ways}", err=True)
        if as_json:
            print_json({**summary, "nodes": held["nodes"]})

    started: list[str] = []
    waited: list[dict[str, Any]] = []  # the allocation's states while it was waited for

    def show(event: dict[str, Any]) -> None:
        if event.get("event") == "started":
            started.append(str(event["job_id"]))
        elif event.get("event") == "ready":
            if not detach:  # detached, the answer says it, with the run's job id
                announce(event)
        elif event.get("event") == "state":
            waited.append(event)
            progress.clear()
            if not as_json:
                click.echo(f"corral: {dev_name}: {allocation_state(event)}", err=True)
        else:
            (warnings_only if as_json else progress)(event)

    try:  # the task's files are sent once; once ready, its `run` runs in the same request
        held = Client().dev_launch(dev_name, task, command=command, idle_minutes=idle_minutes, walltime=walltime,
                                   wait=not detach, run=True, detach=detach, setup=setup, job_name=name,
                                   gpus=gpus, infra=infra,
                                   num_nodes=num_nodes, cpus=cpus, memory=memory, envs=list(envs),
                                   secrets=list(secret_values), workdir=workdir, image_id=image_id,
                                   default_idle_minutes=default_idle, on_event=show, on_output=write_bytes)
    except KeyboardInterrupt:
        progress.clear()
        if started:
            stopped_following(started[0], dev_name)
        if not waited or announced:
            raise
        runs = (f"; the task is queued in it and starts once it is ready (`corral queue {dev_name}`)"
                if task or command else "")
        click.echo(f"\ncorral: Ctrl-C stopped waiting, not the allocation: {dev_name} stays in Slurm's queue "
                   f"({allocation_state(waited[-1])}){runs}. `corral status {dev_name}` shows it, "
                   f"`corral down {dev_name}` releases it.", err=True)
        sys.exit(130)
    finally:
        progress.clear()
    if not announced:
        announce(held)
    return int(held.get("exit_code") or 0)


def say_detached(job_id: str, name: str, queued: dict[str, Any] | None, following: bool = False) -> None:
    """Where a detached run is: started, or queued until its allocation (`queued`, as it is) is ready;
    `following`: this command follows it (Ctrl-C stops that, not the run)."""
    from corral.cli.render import allocation_state

    where = (f"queued in {name}: it starts once {name} is ready, now {allocation_state(queued)}" if queued
             else f"started in {name}")
    follow = "following it (Ctrl-C stops following, not the job)" if following else \
        f"`corral logs {job_id}` follows it"
    click.echo(f"corral: {job_id} {where}; {follow}, `corral cancel {job_id}` stops it", err=True)


def stopped_following(job_id: str, name: str) -> NoReturn:
    """Ctrl-C while an exec runs: it goes on in the allocation, and this says how to reach it."""
    click.echo(f"\ncorral: {job_id} keeps running in {name}; Ctrl-C only stopped following it. "
               f"`corral logs {job_id}` follows it again, `corral cancel {job_id}` stops it.", err=True)
    sys.exit(130)


@click.command(name="exec", context_settings={"allow_interspersed_args": True})
@click.argument("name")
@click.argument("args", nargs=-1)
@click.option("--env", "envs", multiple=True, help="KEY=VALUE, repeatable.")
@click.option("--secret", "secret_values", multiple=True, help="KEY=VALUE or KEY: a secret env, repeatable.")
@click.option("-d", "--detach", "--detach-run", "detach", is_flag=True,
              help="Return once it has started, printing its job id (`sky exec -d`); `corral logs JOB` follows it.")
@click.option("--num-nodes", type=click.IntRange(1, 100_000),
              help="On this many of the allocation's nodes (overrides the task's num_nodes; default: all).")
@click.option("--gpus", help="GPUs per node it takes for itself, e.g. H100:1 (overrides resources.accelerators); "
                             "it waits while other jobs hold them. Default: it sees all, and takes none.")
@click.option("--cpus", help="CPUs per node it needs (N or N+): at most what the allocation holds.")
@click.option("--memory", help="Memory per node it needs in GB (N or N+): at most what the allocation holds.")
@click.option("--infra", help="Where it may run (as the task's infra): the allocation must be there.")
@reports_errors
def exec_(name: str, args: tuple[str, ...], envs: tuple[str, ...], secret_values: tuple[str, ...],
          detach: bool, num_nodes: int | None, gpus: str | None, cpus: str | None, memory: str | None,
          infra: str | None) -> None:
    """Run a task or `-- COMMAND` on every node of dev allocation NAME (or on the task's num_nodes of
    them, as `sky exec`); exits with its exit code. The task's workdir and file_mounts are synced into
    the allocation first. A task naming GPUs takes that many for itself, as in SkyPilot's job queue:
    it sees only those, and waits while other jobs in the allocation hold them."""
    from corral.sdk import Client

    paths, command = task_arguments(args)
    if len(paths) > 1:
        raise click.UsageError("exec runs one task file at a time")
    client = Client()
    started: list[str] = []
    queued: list[dict[str, Any]] = []

    def seen(event: dict[str, Any]) -> None:
        if event.get("event") == "queued":
            queued.append(event["allocation"])
        elif "job_id" in event:
            started.append(str(event["job_id"]))

    try:
        job_id, code = client.dev_exec(name, Path(paths[0]) if paths else None, command=command, detach=detach,
                                       num_nodes=num_nodes, gpus=gpus, cpus=cpus, memory=memory, infra=infra,
                                       envs=list(envs), secrets=list(secret_values), on_output=write_bytes,
                                       on_event=seen)
    except KeyboardInterrupt:
        if not started:
            raise
        stopped_following(started[0], name)
    if code is None:  # detached, or queued because its allocation was not ready
        waits_for = queued[0] if queued else None
        if not detach:  # followed until it ends
            from corral.cli.following import LazyProgress, follow_to_end

            say_detached(job_id, name, waits_for, following=True)
            sys.exit(follow_to_end(client, job_id, LazyProgress()))
        say_detached(job_id, name, waits_for)
        click.echo(job_id)
        return
    if code != 0 and (job := client.job(job_id)).state == "CANCELLED":  # ended by `corral cancel`, say so
        click.echo(f"corral: {job_id} was cancelled ({job.reason}); allocation {name!r} is still held", err=True)
    sys.exit(code)


@click.command(context_settings={"allow_interspersed_args": False})
@click.argument("name")
@click.argument("command", nargs=-1)
@reports_errors
def ssh(name: str, command: tuple[str, ...]) -> None:
    """A shell on the head node of dev allocation NAME (through its login node), or run COMMAND there."""
    import os

    from corral.sdk import Client

    if command and command[0] == "--":
        command = command[1:]
    argv = Client().dev_ssh_argv(name, " ".join(command) or None)
    os.execvp(argv[0], argv)


@click.command()
@click.argument("names", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of allocations.")
@habit_flag("-r", "--refresh")  # it always asks the clusters
@reports_errors
def status(names: tuple[str, ...], as_json: bool) -> None:
    """Dev allocations across all clusters: state, age, idle time, walltime left."""
    from corral.sdk import Client

    allocations = Client().dev_status(list(names))
    if as_json:
        print_json(allocations)
    else:
        from corral.cli.render import render_status

        render_status(allocations)


@click.command()
@click.argument("names", nargs=-1)
@click.option("-a", "--all", "down_all", is_flag=True, help="Release every dev allocation of yours.")
@yes_option
@reports_errors
def down(names: tuple[str, ...], down_all: bool, yes: bool) -> None:
    """Release dev allocations (scancel), clean their files and ssh aliases."""
    from corral.errors import CorralError
    from corral.sdk import Client

    if not names and not down_all:
        raise click.UsageError("name the allocations to release, or use --all")
    client = Client()
    if down_all:
        released, failed = client.dev_down_all()
        for name in released:
            click.echo(f"{name}: released")
        for name, error in failed:
            click.echo(f"corral: {name}: {error}", err=True)
        if not released and not failed:
            click.echo("no dev allocations to release", err=True)
        if failed:
            raise CorralError(f"{len(failed)} allocation{'s' if len(failed) != 1 else ''} could not be taken down")
        return
    for name in names:
        if client.dev_down(name):
            click.echo(f"{name}: released")
        else:
            click.echo(f"{name}: no such allocation (already down)", err=True)


@click.command()
@click.argument("names", nargs=-1)
@click.option("-a", "--all", "every", is_flag=True, help="Every dev allocation of yours.")
@click.option("-i", "--idle-minutes", type=click.FloatRange(0, 525_600), default=None,
              help="Release once idle this many minutes, counted from now (default: 5, as SkyPilot's).")
@click.option("--cancel", is_flag=True, help="Never release for being idle (walltime and `corral down` still do).")
@habit_flag("--down")  # an allocation is always released, never stopped: autostop is autodown here
@yes_option
@reports_errors
def autostop(names: tuple[str, ...], every: bool, idle_minutes: float | None, cancel: bool, yes: bool) -> None:
    """Release live dev allocations once idle (as `sky autostop`): a new idle limit, counted from now.
    Their holders apply it on the cluster, with no Corral process up."""
    from corral.errors import CorralError
    from corral.sdk import Client

    if bool(names) == every:
        raise click.UsageError("name the allocations, or use --all" if not names else "names or --all, not both")
    if cancel and idle_minutes is not None:
        raise click.UsageError("-i or --cancel, not both")
    minutes = 0.0 if cancel else 5.0 if idle_minutes is None else idle_minutes
    changed, not_live = Client().dev_autostop(list(names), minutes)
    for status in changed:
        after = "never released for being idle" if not minutes else f"released once idle for {minutes:g} min"
        click.echo(f"{status['name']}: {after}")
    for status in not_live:
        click.echo(f"corral: {status['name']} is {status['state']}: nothing to release", err=True)
    if every and not changed and not not_live:
        click.echo("no dev allocations", err=True)
    if names and not_live:
        raise CorralError(f"{len(not_live)} allocation{'s' if len(not_live) != 1 else ''} not live")
