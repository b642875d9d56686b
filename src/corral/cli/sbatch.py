"""`corral sbatch [CORRAL OPTIONS] [SBATCH OPTIONS] script [ARGS]`: an existing job script, routed to the
cluster that can start it soonest (this process loads the SDK, and rich for --dryrun only).

Corral's own options come first and are few (`--dryrun`, `--infra`, `--managed`, `--workdir`, `--env`,
`--env-file`, `--secret`, `--json`); every other option before the script is sbatch's, read as sbatch
reads it; every word after the script is the script's.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import click

from corral.cli.common import (
    handle_in,
    piped_stdin,
    print_json,
    read_env_file,
    reports_errors,
    show_plans,
    warnings_only,
)

# Corral's options: name -> takes a value. None of them is an sbatch option.
CORRAL_OPTIONS = {"--dryrun": False, "--managed": False, "--json": False, "--infra": True, "--workdir": True,
                  "--env": True, "--env-file": True, "--secret": True}
USAGE = """Usage: corral sbatch [CORRAL OPTIONS] [SBATCH OPTIONS] SCRIPT [ARGS]...
       corral sbatch [CORRAL OPTIONS] [SBATCH OPTIONS] --wrap COMMAND
       corral sbatch [CORRAL OPTIONS] [SBATCH OPTIONS] < SCRIPT

  Run an sbatch job script as it is, on the cluster that can start it soonest. Its #SBATCH lines,
  and the sbatch options given here (which win, as with sbatch), say what it needs. Per cluster, Corral
  rewrites only the partition, the GPU type's spelling (h100 -> nvidia_h100_80gb_hbm3) and the
  profile's account and QOS; --dryrun shows each cluster's script as a diff. --wrap COMMAND runs
  COMMAND in the sh script sbatch would write for it.

  -p/--partition here pins the partition; one in the script is kept on a cluster that has it, and
  chosen by Corral elsewhere.

Corral options (before the sbatch options):
  --dryrun           Show the plan, and the script and command line each cluster would receive.
  --infra TEXT       Where it may run: slurm/<cluster>[/<partition>].
  --managed          A managed job: recovered from node failures and preemption, re-routed while pending.
  --workdir DIR      Send DIR; the job starts in its copy (else in an empty folder of its own).
  --env KEY=VALUE    Add to the job's environment (repeatable); --env-file FILE; --secret KEY[=VALUE].
  --json             Machine-readable output.

-W/--wait waits for the job (each array task) to end, as sbatch does, and exits with its exit code.
"""


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
               add_help_option=False)
@click.argument("words", nargs=-1, type=click.UNPROCESSED)
@reports_errors
def sbatch(words: tuple[str, ...]) -> None:
    """Run an sbatch job script as it is, on the cluster that can start it soonest."""
    if (not words and piped_stdin() is None) or words[:1] in (("--help",), ("-h",)):
        click.echo(USAGE)
        return
    ours, rest = _corral_options(words)
    misplaced = next((w for w in _leading_options(rest) if w.partition("=")[0] in CORRAL_OPTIONS), None)
    if misplaced is not None:
        from corral.errors import TaskError

        raise TaskError(f"corral sbatch: {misplaced.partition('=')[0]} is Corral's option: give it before the sbatch "
                        f"options (corral sbatch {misplaced.partition('=')[0]} … -t 30 script.sh)")
    from corral.sbatch_script import split_command_line

    options, option_words, script, args, wrap, wait, test_only = split_command_line(rest)
    if test_only:  # sbatch's own dry run: the plan says when and where it would start
        ours["--dryrun"].append("1")
    text = None
    if script is None and wrap is None:
        text = _script_on_stdin()
    envs = [*read_env_file(ours["--env-file"][-1]), *ours["--env"]] if ours["--env-file"] else list(ours["--env"])
    from corral.sdk import Client

    client = Client()
    result = client.sbatch(Path(script) if script is not None else None, wrap=wrap, text=text, options=option_words,
                           args=list(args), dryrun=bool(ours["--dryrun"]), managed=bool(ours["--managed"]),
                           infra=_last(ours["--infra"]), envs=envs, secrets=list(ours["--secret"]),
                           workdir=_last(ours["--workdir"]), on_event=warnings_only)
    as_json = bool(ours["--json"])
    if ours["--dryrun"]:
        show_plans([[row.raw for row in result[0]]], as_json)  # type: ignore[index]
        return
    if ours["--managed"]:  # not with --dryrun, which returned above
        job_ids = list(result)  # type: ignore[arg-type]
        if as_json:  # as `corral jobs launch --json`
            print_json({"job_id": job_ids[0], "job_ids": job_ids})
        elif any(o.name == "parsable" for o in options):
            click.echo("\n".join(job_ids))
        else:
            many = f"s {job_ids[0]}..{job_ids[-1]} ({len(job_ids)} array tasks)" if len(job_ids) > 1 else ""
            click.echo(f"Submitted managed job{many or ' ' + job_ids[0]}")
    else:
        shares = [s.raw for s in result.submissions]  # type: ignore[union-attr]
        job_ids = [job_id for share in shares for job_id in share.get("job_ids") or []]
        _report_submitted(shares, as_json, parsable=any(o.name == "parsable" for o in options))
    if wait:
        from corral.cli.following import wait_quietly

        sys.stdout.flush()
        sys.exit(wait_quietly(client, job_ids, managed=bool(ours["--managed"])))


def _report_submitted(shares: list[dict], as_json: bool, *, parsable: bool) -> None:
    if as_json:  # a script is one Slurm job (an array's tasks: one Corral job each, in job_ids and handles)
        print_json(shares[0])
        return
    for share in shares:
        ids = share.get("job_ids") or []
        job = ids[0] if len(ids) == 1 else f"{ids[0]}..{ids[-1]} ({len(ids)} array tasks)"
        if parsable:
            click.echo(f"{ids[0]};{share.get('cluster')}")
        else:
            click.echo(f"Submitted batch job {job} on slurm/{share.get('cluster')}/{share.get('partition')} "
                       f"(Slurm job {handle_in(share)})")


def _script_on_stdin() -> str:
    """The script, read on standard input as sbatch reads one there (`corral sbatch < job.sh`, a here
    document); a terminal there means none was given."""
    from corral.errors import TaskError

    stdin = piped_stdin()
    if stdin is None:
        raise TaskError("corral sbatch: no script given (corral sbatch [OPTIONS] script.sh [ARGS], "
                        "corral sbatch [OPTIONS] --wrap COMMAND, or the script on standard input)")
    from corral.taskfile import read_task_stream

    try:
        text = read_task_stream(stdin.buffer, "standard input", "job script")
    except (OSError, ValueError, AttributeError) as exc:  # closed, or not a byte stream
        raise TaskError(f"corral sbatch: no script given, and standard input cannot be read ({exc})") from None
    if not text.strip():
        raise TaskError("corral sbatch: no script given: standard input was empty (give script.sh, or "
                        "--wrap COMMAND)")
    return text


def _corral_options(words: Sequence[str]) -> tuple[dict[str, list[str]], list[str]]:
    """Corral's options from the front of the words (up to the first that is not one), and the rest."""
    ours: dict[str, list[str]] = {name: [] for name in CORRAL_OPTIONS}
    i = 0
    while i < len(words):
        name, eq, value = words[i].partition("=")
        if name not in CORRAL_OPTIONS:
            break
        if CORRAL_OPTIONS[name] and not eq:
            if i + 1 >= len(words):
                from corral.errors import TaskError

                raise TaskError(f"corral sbatch: {name} needs a value")
            i += 1
            value = words[i]
        ours[name].append(value if CORRAL_OPTIONS[name] else "1")
        i += 1
    return ours, list(words[i:])


def _leading_options(words: Sequence[str]) -> list[str]:
    """The words before the script (or `--`) that look like options."""
    leading = []
    for word in words:
        if word == "--" or not word.startswith("-"):
            break
        leading.append(word)
    return leading


def _last(values: list[str]) -> str | None:
    return values[-1] if values else None


