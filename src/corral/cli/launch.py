"""`corral launch`: a task to the cluster that can start it soonest, through the server's API (the
dev-allocation form, `-c NAME`, lives in `cli/dev.py`). This process loads the SDK and rich only."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from corral.cli.common import (
    print_json,
    read_env_file,
    reports_errors,
    show_plans,
    task_arguments,
    task_options,
    warnings_only,
)
from corral.cli.following import LazyProgress, follow_to_end


@click.command(context_settings={"allow_interspersed_args": True})
@click.argument("args", nargs=-1)
@task_options
@click.option("--num-jobs", type=int, default=1, show_default=True,
              help="Launch N copies (a sweep, at most 10,000); CORRAL_JOB_RANK tells them apart.")
@click.option("-d", "--detach", "--detach-run", "detach", is_flag=True,
              help="Return once Slurm has accepted the job (SkyPilot's --detach-run).")
@click.option("-s", "--detach-setup", is_flag=True,
              help="Accepted as SkyPilot users type it: setup always runs inside the Slurm job.")
@click.option("--dryrun", is_flag=True, help="Show the placement plan; submit nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("-c", "--cluster-name", "dev_name", help="Hold a named dev allocation (or reuse it) and run the task in it.")
@click.option("--no-setup", is_flag=True,
              help="With -c: run the task without its setup, on a live allocation or a new one (as SkyPilot's).")
@click.option("-i", "--idle-minutes", "--idle-minutes-to-autostop", "idle_minutes", type=float, default=None,
              help="With -c: release the allocation after M idle minutes (SkyPilot's -i).")
@click.option("--time", "walltime", help="Walltime (sbatch --time), e.g. 4:00:00.")
@reports_errors
def launch(args: tuple[str, ...], name: str | None, gpus: str | None, infra: str | None, num_nodes: int | None,
           cpus: str | None, memory: str | None, envs: tuple[str, ...], env_file: str | None, workdir: str | None,
           image_id: str | None, yes: bool, secret_values: tuple[str, ...], num_jobs: int,
           detach: bool, detach_setup: bool, dryrun: bool, as_json: bool, dev_name: str | None,
           idle_minutes: float | None, walltime: str | None, no_setup: bool) -> None:
    """Run a task on the cluster that can start it soonest.

    ARGS: task YAML file(s), or a command (`corral launch 'python train.py'`, or after `--`). Without -d,
    follows the job's output and exits with its exit code; Ctrl-C stops following, not the job.
    """
    from corral.taskfile import check_num_jobs

    check_num_jobs(num_jobs)
    envs = (*read_env_file(env_file), *envs) if env_file else envs
    if dev_name and not dryrun:
        from corral.cli.dev import launch_dev

        sys.exit(launch_dev(args, dev_name, name=name, gpus=gpus, infra=infra, num_nodes=num_nodes, cpus=cpus,
                            memory=memory, envs=envs, secret_values=secret_values, num_jobs=num_jobs,
                            idle_minutes=idle_minutes, walltime=walltime, detach=detach, as_json=as_json,
                            workdir=workdir, image_id=image_id, setup=not no_setup))
    from corral.sdk import Client

    paths, command = task_arguments(args, allow_empty=bool(dev_name))
    client = Client()
    progress = LazyProgress()
    try:
        result = client.launch([Path(p) for p in paths] or None, command=command, num_jobs=num_jobs,
                               dryrun=dryrun, name=name, gpus=gpus, infra=infra, num_nodes=num_nodes, cpus=cpus, memory=memory,
                               envs=list(envs), secrets=list(secret_values), time=walltime, workdir=workdir,
                               image_id=image_id, dev=bool(dev_name and dryrun),
                               on_event=warnings_only if as_json else progress)
    except KeyboardInterrupt:
        progress.clear()
        click.echo("corral: interrupted; the server finishes what it had started: `corral queue` shows "
                   "whether a job was submitted", err=True)
        sys.exit(130)
    finally:
        progress.clear()
    from corral.cli import render  # loaded by the first progress event already, unless --json

    if dryrun:
        show_plans([[row.raw for row in plan] for plan in result], as_json)
        return
    shares = [s.raw for s in result.submissions]
    sweep = len(shares) > 1 or num_jobs > 1
    if as_json:
        print_json(render.sweep_json(shares) if sweep else render.submitted_json(shares[0]))
    if detach or sweep:
        if not as_json:
            for job_id in result.job_ids:
                click.echo(job_id)
        return
    sys.exit(follow_to_end(client, result.job_id, progress))
