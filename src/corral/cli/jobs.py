"""`corral jobs`: managed jobs, recovered from failures and re-routed while pending by the server's
controller. Every command is one or two API calls; this process loads the SDK and rich only."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from corral.cli.common import (
    cancel_command,
    habit_flag,
    log_options,
    newest_id,
    paging,
    print_json,
    read_env_file,
    reports_errors,
    task_arguments,
    task_options,
    warnings_only,
)
from corral.cli.following import follow_managed, status_only
from corral.timefmt import clock


@click.group()
def jobs() -> None:
    """Managed jobs: recovered from node failures and outages, re-routed while pending."""


@jobs.command(name="launch", context_settings={"allow_interspersed_args": True})
@click.argument("args", nargs=-1)
@task_options
@click.option("--num-jobs", type=int, default=1, show_default=True, help="Launch N managed copies (a sweep, at most 10,000).")
@click.option("--json", "as_json", is_flag=True, help="Print {job_id, job_ids} (and the pipeline's name).")
@click.option("-d", "--detach", "--detach-run", "--async", "detach", is_flag=True,
              help="Return once the job is recorded, with its id (always so with --json or --num-jobs).")
@reports_errors
def jobs_launch(args: tuple[str, ...], name: str | None, gpus: str | None, infra: str | None,
                num_nodes: int | None, cpus: str | None, memory: str | None, envs: tuple[str, ...],
                env_file: str | None, workdir: str | None, image_id: str | None, yes: bool,
                secret_values: tuple[str, ...], num_jobs: int, as_json: bool, detach: bool) -> None:
    """Record a managed job, which the server's controller places, watches and recovers; then follow
    its output through its attempts until it ends, and exit with its exit code, as `sky jobs launch`
    does. Ctrl-C stops following, not the job; -d returns its id at once. A task file of several YAML
    documents is a pipeline: its tasks run one after another, each once the one before it succeeded
    (the flags apply to each; -n names the pipeline); with `execution: parallel` in its header, a job
    group: its tasks run side by side on one cluster."""
    from corral.errors import TaskError
    from corral.sdk import Client
    from corral.taskfile import check_num_jobs

    check_num_jobs(num_jobs)
    envs = (*read_env_file(env_file), *envs) if env_file else envs
    paths, command = task_arguments(args)
    if len(paths) > 1:
        raise TaskError("a managed job runs one task file; launch several with one `corral jobs launch` each")
    client = Client()
    pipelines: list[dict[str, Any]] = []  # the server's `pipeline` event, for a file of several tasks

    def on_event(event: dict[str, Any]) -> None:
        if event.get("event") == "pipeline":
            pipelines.append(event)
        warnings_only(event)

    ids = client.managed_launch(Path(paths[0]) if paths else None, command=command, num_jobs=num_jobs, name=name,
                                gpus=gpus, infra=infra, num_nodes=num_nodes, cpus=cpus, memory=memory,
                                envs=list(envs), secrets=list(secret_values), workdir=workdir, image_id=image_id,
                                on_event=on_event)
    pipeline = pipelines[0] if pipelines else None
    if as_json:
        print_json({"job_id": ids[0], "job_ids": ids, **({"pipeline": pipeline["name"]} if pipeline else {})})
    elif pipeline and pipeline.get("execution") == "parallel" and not detach:
        click.echo(f"corral: job group {pipeline['name']} recorded: {len(ids)} tasks ({', '.join(ids)}), run side "
                   "by side on one cluster; following each in turn (Ctrl-C stops following, not the group)", err=True)
        # Its first primary task: an auxiliary one runs until the primary ones end.
        first = next((i for i in ids if i not in pipeline.get("auxiliary", [])), ids[0])
        click.echo(f"=== job group {pipeline['name']}, task {ids.index(first)}: {first} ===", err=True)
        sys.exit(follow_managed(client, first, follow=True))
    elif pipeline and not detach:
        click.echo(f"corral: managed pipeline {pipeline['name']} recorded: {len(ids)} tasks ({', '.join(ids)}), "
                   "run one after another; following it (Ctrl-C stops following, not the pipeline)", err=True)
        click.echo(f"=== pipeline {pipeline['name']}, task 0: {ids[0]} ===", err=True)
        sys.exit(follow_managed(client, ids[0], follow=True))
    elif detach or len(ids) > 1:
        click.echo("\n".join(ids))
    else:
        click.echo(f"corral: managed job {ids[0]} recorded; following it (Ctrl-C stops following, not the job)",
                   err=True)
        sys.exit(follow_managed(client, ids[0], follow=True))


@jobs.command(name="queue")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@habit_flag("-r", "--refresh")  # the server's controller keeps them fresh
@click.option("-a", "--all", "show_all", is_flag=True, help="Every managed job ever launched.")
@paging("managed jobs")
@reports_errors
def jobs_queue(as_json: bool, show_all: bool, limit: int, page: int, since: float | None) -> None:
    """Managed jobs with their state, attempts and reason (as of the controller's last tick): the live
    ones and the newest ended ones, newest first."""
    from corral.sdk import Client

    shown, more = Client().managed_jobs(limit=limit, page=page, all=show_all, since=since)
    rows = [j.raw for j in shown]
    if as_json:
        print_json(rows)
    else:
        from corral.cli.managed_table import render_managed

        render_managed(rows)
        if more and limit:
            click.echo(f"{more} more ended managed job{'s' if more != 1 else ''}: "
                       f"`corral jobs queue --page {page + 1}`, `--since 1d`, or `--all`", err=True)


@jobs.command(name="logs")
@log_options("Follow the job until it ends, attempt after attempt, as `sky jobs logs` does.",
             "Only the current attempt, starting with its last N lines (0: every attempt, all of it).")
@click.argument("task", required=False)
@reports_errors
def jobs_logs(job: str | None, task: str | None, follow: bool, tail: int, status: bool, sync_down: bool) -> None:
    """A managed job's output across its attempts, following it through recoveries until it ends; then
    how it ended, and exit with its exit code. Without JOB: your newest managed job. A pipeline's or
    job group's tasks one after another, or only TASK of them (its place, 0, 1, …, or its name), as
    `sky jobs logs JOB TASK`."""
    from corral.sdk import Client

    client = Client()
    if job is None:
        job = newest_id(client.managed_jobs(limit=1)[0],
                        "no managed jobs yet: name one, or launch one with `corral jobs launch`")
    if task is not None:
        job = pipeline_task(client.managed_job(job), task)
    if status:
        from corral.sdk.types import ManagedJob

        sys.exit(status_only(ManagedJob.from_json(client.managed_job(job))))
    if sync_down:  # each attempt's output to its own file
        from corral.cli.sync_down import sync_down_managed

        sync_down_managed(client, job)
        return
    sys.exit(follow_managed(client, job, follow=follow, tail=tail, whole=task is None))


def pipeline_task(found: dict[str, Any], task: str) -> str:
    """The id of the task TASK names (its place or its name) in the pipeline or job group of `found`."""
    ids, names = list(found.get("pipeline_tasks") or []), list(found.get("pipeline_task_names") or [])
    if not ids:
        raise click.UsageError(f"{found['job_id']} is one managed job, not a pipeline or job group: give no TASK")
    if task.isdigit() and int(task) < len(ids):
        return ids[int(task)]
    if names.count(task) == 1:
        return ids[names.index(task)]
    listed = ", ".join(f"{i} ({n})" for i, n in enumerate(names))
    raise click.UsageError(f"TASK {task!r}: give one task's place or name: {listed}")


@jobs.command(name="cancel")
@cancel_command("managed jobs")
@reports_errors
def jobs_cancel(refs: list[str], cancel_all: bool, all_users: bool) -> list[Any]:
    """Ask the controller to cancel managed jobs (it scancels their attempts at once)."""
    from corral.sdk import Client

    return Client().managed_cancel(refs, all=cancel_all, all_users=all_users)


@jobs.command(name="events")
@click.argument("job")
@click.option("--json", "as_json", is_flag=True)
@reports_errors
def jobs_events(job: str, as_json: bool) -> None:
    """A managed job's history: every state change and why."""
    from corral.sdk import Client

    events = Client().managed_job(job)["events"]
    if as_json:
        print_json(events)
        return
    for e in events:
        click.echo(f"{clock(e['at'])}  {e['state']:<11} {e['reason'] or ''}")


@jobs.command(name="why")
@click.argument("job")
@reports_errors
def jobs_why(job: str) -> None:
    """Why a pending managed job waits where it is: its Slurm reason, predicted starts here and on the
    best alternative, and why it has not moved."""
    from corral.sdk import Client

    for line in Client().managed_why(job):
        click.echo(line)
