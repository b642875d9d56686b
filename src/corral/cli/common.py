"""What every command module shares: one-line errors with the error class's exit code, JSON output,
raw output bytes, `--` and paging options. Imports click only."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import click

DEFAULT_QUEUE_LIMIT = 20


def reports_errors(func: Callable[..., Any]) -> Callable[..., Any]:
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


def print_json(value: object) -> None:
    click.echo(json.dumps(value, indent=2))


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


def task_arguments(args: tuple[str, ...], *, allow_empty: bool = False) -> tuple[list[str], str | None]:
    """(task file paths, one command line) from a command's arguments; a command is joined like a shell
    line, as `sky launch -- CMD` does (it becomes the task's run, not argv)."""
    from corral.errors import TaskError

    paths, command = split_command(args)
    if command and paths:
        raise TaskError("give either task files or `-- COMMAND`, not both")
    if not paths and not command and not allow_empty:
        raise TaskError("nothing to launch: give a task YAML or `-- COMMAND…`")
    return list(paths), " ".join(command) if command else None


def paging(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--limit` and `--page` for a listing of `what` (live ones always shown, ended ones paged)."""
    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        func = click.option("--page", type=click.IntRange(1, 1_000_000), default=1, show_default=True,
                            help=f"Which page of ended {what}, --limit per page.")(func)
        return click.option("-n", "--limit", type=click.IntRange(1, 100_000), default=DEFAULT_QUEUE_LIMIT,
                            show_default=True, help=f"How many ended {what} to show after the live ones.")(func)
    return decorate


def task_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The overrides `launch` and `jobs launch` share, as SkyPilot names them."""
    for decorator in reversed([
        click.option("-n", "--name", help="Job name (default: the task's name)."),
        click.option("--gpus", help="Accelerators per node, e.g. H100:8 (overrides resources.accelerators)."),
        click.option("--infra", help="slurm, slurm/<cluster> or slurm/<cluster>/<partition>."),
        click.option("--num-nodes", type=click.IntRange(1, 100_000), help="Number of nodes."),
        click.option("--cpus", help="CPUs per node: N or N+."),
        click.option("--memory", help="Memory per node in GB: N or N+."),
        click.option("--env", "envs", multiple=True, help="KEY=VALUE, repeatable."),
        click.option("--secret", "secret_values", multiple=True,
                     help="KEY=VALUE, or KEY to take it from your environment: an env kept out of the store "
                          "in clear text."),
    ]):
        func = decorator(func)
    return func
